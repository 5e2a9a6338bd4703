"""Counter-based Gumbel-max sampling: the draw of token `t` of a request is a function of
(request seed, t) only, never of a generator's history (torch and numpy, no vLLM).

An engine that restarts a request from its token prefix (vLLM's resubmission after a migration:
its per-request generator would restart) continues it token for token: token `t` is

    argmax_i  logits_i / T + G_i(seed, t),     G_i = -log(-log(U_i)),

which picks token i with probability softmax(logits / T)_i (the Gumbel-max trick), with
`U_i(seed, t)` a hash of (seed, t, i). The hash is murmur3's 32-bit finaliser: in numpy's
wrapping uint32 arithmetic on the CPU, and on other devices in int64 tensors whose intermediate
values never overflow (the 32-bit multiplies are split in 16-bit halves). Either way the noise is
bit-identical on every device type and batch layout, and vectorised over [rows, vocab].
"""

from __future__ import annotations

import functools
import hashlib
import struct

import numpy as np
import torch

# A vLLM request's draw parameters, in its `SamplingParams.extra_args` (`rollout.vllm_sampler`,
# `rollout.vllm_speculative`): seed, index of its first token in this submission, temperature.
SEED = "dynaresize_seed"
OFFSET = "dynaresize_offset"
TEMPERATURE = "dynaresize_temperature"

_MASK32 = 0xFFFFFFFF
_M1, _M2 = 0x85EBCA6B, 0xC2B2AE35  # murmur3's 32-bit finaliser constants


def draw_key(seed: int, t: int) -> tuple[int, int]:
    """Two 32-bit keys of the draw of token `t` of the request with `seed`."""
    digest = hashlib.blake2b(struct.pack("<QQ", seed & (2**64 - 1), t), digest_size=8).digest()
    return struct.unpack("<II", digest)


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """(h * c) mod 2**32 for h in [0, 2**32) without leaving int64's range."""
    hi, lo = h >> 16, h & 0xFFFF
    return ((((hi * c) & 0xFFFF) << 16) + lo * c) & _MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's finaliser: a bijection of [0, 2**32) with full avalanche."""
    h = h ^ (h >> 16)
    h = _mul32(h, _M1)
    h = h ^ (h >> 13)
    h = _mul32(h, _M2)
    return h ^ (h >> 16)


def uniforms(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """U(seed, t, i) in (0, 1), float64 [rows, vocab_size] on `keys`' device; `keys`: int64
    [rows, 2] from `draw_key` (53 random bits per value, from two hashes). On the CPU the hash
    runs in numpy's wrapping uint32 arithmetic (~0.2 ms a row of 49,152 tokens against ~2 ms
    for the int64 tensors, measured), elsewhere in torch; the two are bit-identical."""
    if keys.device.type == "cpu":
        k = keys.numpy().astype(np.uint32)
        return torch.from_numpy(_uniforms_np(k[:, :1], k[:, 1:], _index(vocab_size)[None, :]))
    return _uniforms_torch(keys, vocab_size)


def _uniforms_torch(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    index = torch.arange(vocab_size, dtype=torch.int64, device=keys.device)[None, :]
    k0, k1 = keys[:, :1], keys[:, 1:]
    a = _fmix32(_fmix32(index ^ k0) ^ k1)
    b = _fmix32(a ^ _fmix32(k1 ^ 0x9E3779B9)) >> 11  # 21 bits
    return ((a << 21) + b).to(torch.float64).add_(0.5).mul_(2.0 ** -53)


def gumbel_at(seed: int, t: int, token_ids: np.ndarray) -> np.ndarray:
    """G_i(seed, t) of the tokens `token_ids` (int [n]) only, float64 [n]: the same hash as
    `uniforms` (a drafter's view of the noise, ~20x cheaper than a whole row for a few tokens);
    equal to `gumbel_sample`'s noise up to the last bit of the two logarithms (numpy's, not
    torch's)."""
    k0, k1 = draw_key(seed, t)
    u = _uniforms_np(np.uint32(k0), np.uint32(k1), np.asarray(token_ids, dtype=np.uint32))
    return -np.log(-np.log(u))


@functools.lru_cache(maxsize=4)
def _index(vocab_size: int) -> np.ndarray:
    index = np.arange(vocab_size, dtype=np.uint32)
    index.flags.writeable = False
    return index


def _uniforms_np(k0: np.ndarray | np.uint32, k1: np.ndarray | np.uint32, index: np.ndarray
                 ) -> np.ndarray:
    """`uniforms`' hash in uint32 numpy (products wrap mod 2**32, as murmur3 means), float64,
    broadcast over `k0`, `k1` and `index`."""
    a = _fmix32_np(index ^ k0)
    a ^= k1
    a = _fmix32_np(a)
    b = _fmix32_np(a ^ _fmix32_np(np.asarray(k1 ^ np.uint32(0x9E3779B9), dtype=np.uint32)))
    b >>= np.uint32(11)  # 21 bits
    u = a.astype(np.float64)
    u *= 2.0 ** 21
    u += b
    u += 0.5
    u *= 2.0 ** -53
    return u


def _fmix32_np(h: np.ndarray) -> np.ndarray:
    """`_fmix32` on a fresh uint32 array, in place (numpy's uint32 products wrap)."""
    h ^= h >> np.uint32(16)
    h *= np.uint32(_M1)
    h ^= h >> np.uint32(13)
    h *= np.uint32(_M2)
    h ^= h >> np.uint32(16)
    return h


def gumbel_sample(logits: torch.Tensor, temperatures: torch.Tensor, keys: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` [rows, vocab] (any float dtype, any device):
    returns (tokens int64 [rows], their log-probs under softmax(logits / T), float64 [rows]).
    `temperatures` [rows] > 0; `keys` int64 [rows, 2] (`draw_key(seed, t)` of each row)."""
    scaled = logits.to(torch.float64) / temperatures.to(torch.float64)[:, None]
    noisy = uniforms(keys, logits.shape[-1]).log_().neg_().log_().neg_().add_(scaled)
    tokens = torch.argmax(noisy, dim=-1)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs
