"""Counter-based Gumbel-max sampling: the draw of token `t` of a request is a function of
(request seed, t) only, never of a generator's history (pure torch, no vLLM).

An engine that restarts a request from its token prefix (vLLM's resubmission after a migration:
its per-request generator would restart) continues it token for token: token `t` is

    argmax_i  logits_i / T + G_i(seed, t),     G_i = -log(-log(U_i)),

which picks token i with probability softmax(logits / T)_i (the Gumbel-max trick), with
`U_i(seed, t)` a hash of (seed, t, i). The hash is integer arithmetic on int64 tensors whose
intermediate values never overflow (the 32-bit multiplies are split in 16-bit halves), so the
noise is bit-identical on every device type and batch layout, and vectorised over [rows, vocab].
"""

from __future__ import annotations

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
    """U(seed, t, i) in (0, 1), float64 [rows, vocab_size]; `keys`: int64 [rows, 2] from
    `draw_key` (53 random bits per value, from two hashes)."""
    index = torch.arange(vocab_size, dtype=torch.int64, device=keys.device)[None, :]
    k0, k1 = keys[:, :1], keys[:, 1:]
    a = _fmix32(_fmix32(index ^ k0) ^ k1)
    b = _fmix32(a ^ _fmix32(k1 ^ 0x9E3779B9)) >> 11  # 21 bits
    return ((a << 21) + b).to(torch.float64).add_(0.5).mul_(2.0 ** -53)


def gumbel_at(seed: int, t: int, token_ids: np.ndarray) -> np.ndarray:
    """G_i(seed, t) of the tokens `token_ids` (int [n]) only, float64 [n]: the same hash as
    `uniforms` in numpy (a drafter's view of the noise, ~20x cheaper than torch for a few
    tokens); equal to `gumbel_sample`'s noise up to the last bit of the two logarithms."""
    k0, k1 = draw_key(seed, t)
    index = np.asarray(token_ids, dtype=np.uint64)
    a = _fmix32_np(_fmix32_np(index ^ np.uint64(k0)) ^ np.uint64(k1))
    b = _fmix32_np(a ^ _fmix32_np(np.uint64(k1 ^ 0x9E3779B9))) >> np.uint64(11)
    u = ((a << np.uint64(21)) + b).astype(np.float64)
    u = (u + 0.5) * 2.0 ** -53
    return -np.log(-np.log(u))


def _fmix32_np(h: np.ndarray) -> np.ndarray:
    """`_fmix32` on uint64 arrays (a product's low 32 bits are exact mod 2**64)."""
    mask = np.uint64(_MASK32)
    h = h ^ (h >> np.uint64(16))
    h = (h * np.uint64(_M1)) & mask
    h = h ^ (h >> np.uint64(13))
    h = (h * np.uint64(_M2)) & mask
    return h ^ (h >> np.uint64(16))


def gumbel_sample(logits: torch.Tensor, temperatures: torch.Tensor, keys: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` [rows, vocab] (any float dtype, any device):
    returns (tokens int64 [rows], their log-probs under softmax(logits / T), float64 [rows]).
    `temperatures` [rows] > 0; `keys` int64 [rows, 2] (`draw_key(seed, t)` of each row)."""
    scaled = logits.to(torch.float64) / temperatures.to(torch.float64)[:, None]
    noise = -torch.log(-torch.log(uniforms(keys, logits.shape[-1])))
    tokens = torch.argmax(scaled + noise, dim=-1)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs
