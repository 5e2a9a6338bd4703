"""Fixed-row forwards: logits that do not depend on how many positions a forward carries.

Exact speculative decoding verifies k draft tokens in one forward and keeps a draft only if it
equals the token the sampler draws there, so the k-position forward's logits must equal, bit
for bit, those of decoding one position at a time. On CPU they do not by default: a matrix
product with one row runs another kernel (gemv) than one with several, and SDPA's attention
kernel rounds differently by query length (measured: docs/speculative.md).

The route taken here: every forward of a request, speculative or not, prompt chunk or decode
step, feeds exactly `rows` positions (the real tokens, then padding that repeats the last one;
the cache is cropped back to the real tokens afterwards), with attention computed in fixed
blocks of keys (`fixed_block_attention`). Causal masking keeps the real rows blind to the
padding, and past two small-shape regimes (`MIN_ROWS`, `MIN_KEYS`) each row's arithmetic is the
same whatever the other rows hold and however many masked keys follow: measured bitwise at any
split of a sequence into chunks of 1..rows tokens, up to 1200 positions
(tests/unit/test_engine_speculative.py; docs/speculative.md has the measurements).
"""

from __future__ import annotations

from typing import Any

import torch

from dynaresize.rollout.speculative import MIN_ROWS

KEY_BLOCK = 64
"""Attention works on blocks of this many keys (below the measured threshold, ~192 keys, above
which a matmul's reduction over the keys is split differently)."""
ATTENTION = "dynaresize_fixed_blocks"


def fixed_block_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                          value: torch.Tensor, attention_mask: torch.Tensor | None,
                          scaling: float, dropout: float = 0.0, **kwargs: Any
                          ) -> tuple[torch.Tensor, None]:
    """Causal attention of batch-1 `query` [1, heads, M, d] over `key`/`value` [1, kv_heads, N,
    d] (the last M keys are the queries' own positions), computed in blocks of `KEY_BLOCK` keys
    (zero-padded) whose partial outputs are summed in block order: every matmul has the same
    shape whatever N is, so a row's result does not depend on how many masked keys follow it.
    `attention_mask` is ignored (batch 1, no padding: the causal mask is built here)."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    batch, heads, rows, dim = query.shape
    num_keys = key.shape[2]
    blocks = -(-num_keys // KEY_BLOCK)
    pad = blocks * KEY_BLOCK - num_keys
    if pad:
        key = torch.nn.functional.pad(key, (0, 0, 0, pad))
        value = torch.nn.functional.pad(value, (0, 0, 0, pad))
    key = key.view(batch, heads, blocks, KEY_BLOCK, dim)
    value = value.view(batch, heads, blocks, KEY_BLOCK, dim)
    scores = torch.matmul(query[:, :, None], key.transpose(-1, -2)) * scaling  # [b,h,B,M,K]
    scores = scores.transpose(2, 3).reshape(batch, heads, rows, blocks * KEY_BLOCK)
    visible = (torch.arange(blocks * KEY_BLOCK, device=query.device)[None, :]
               <= torch.arange(num_keys - rows, num_keys, device=query.device)[:, None])
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = probs.view(batch, heads, rows, blocks, KEY_BLOCK).transpose(2, 3)
    parts = torch.matmul(probs, value)  # [b, h, B, M, d]
    out = parts[:, :, 0]
    for block in range(1, blocks):
        out = out + parts[:, :, block]
    return out.transpose(1, 2).contiguous(), None


def not_plain_causal(config: Any) -> str | None:
    """Why a transformers model config's attention is not plain causal attention (which is
    all `fixed_block_attention` computes), or None: sliding windows, logit soft-capping."""
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    if "sliding_attention" in layer_types or (getattr(config, "use_sliding_window", False)
                                               and window):
        return f"a sliding window of {window} keys"
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, key, None):
            return f"{key} = {getattr(config, key)}"
    return None


def use_row_invariant_attention(model: torch.nn.Module) -> None:
    """Switch `model` (a transformers model) to `fixed_block_attention` (SDPA's CPU kernel is
    not invariant in the query length, plain eager attention not in the key length).
    ValueError for a model whose attention is not plain causal (`not_plain_causal`): the
    blocks would sample from other logits than the model (and the trainer) compute."""
    from transformers import AttentionInterface

    why = not_plain_causal(getattr(model, "config", None))
    if why is not None:
        raise ValueError(f"rollout.speculative.forward_rows: this model's attention has {why}; "
                         "fixed-row forwards compute plain causal attention only: set "
                         "rollout.speculative.forward_rows = 0 (and speculation off)")

    AttentionInterface.register(ATTENTION, fixed_block_attention)
    model.set_attn_implementation(ATTENTION)


MIN_KEYS = 32
"""Fewest attention keys (cache + fed rows) a forward sees: measured, q @ k^T rounds
differently for fewer than 12 keys and softmax for fewer than 16 (its vectorised path); the
first forwards of a request are padded further, so every forward is past both."""


def fixed_rows_forward(model: torch.nn.Module, cache: Any, tokens: list[int], rows: int, *,
                       cache_arg: str, device: torch.device) -> torch.Tensor:
    """Feed `tokens` (1..rows of them, batch 1) after the tokens already in `cache`, padded to
    `rows` positions (more while the cache is shorter than `MIN_KEYS - rows`); the cache keeps
    only the real tokens. Returns their logits [n, vocab]."""
    n = len(tokens)
    if not 1 <= n <= rows or rows < MIN_ROWS:
        raise ValueError(f"fixed_rows_forward: need 1..{rows} tokens and rows >= {MIN_ROWS}, "
                         f"got {n} tokens")
    start = cache.get_seq_length()
    rows = max(rows, MIN_KEYS - start)
    padded = tokens + [tokens[-1]] * (rows - n)
    input_ids = torch.tensor([padded], dtype=torch.long, device=device)
    position_ids = torch.arange(start, start + rows, device=device)[None]
    out = model(input_ids=input_ids, position_ids=position_ids, use_cache=True,
                **{cache_arg: cache})
    if rows > n:
        cache.crop(-(rows - n))  # negative: remove that many (every transformers 5.x)
    return out.logits[0, :n]


def fixed_rows_prefill(model: torch.nn.Module, cache: Any, tokens: list[int], rows: int, *,
                       cache_arg: str, device: torch.device) -> None:
    """Feed `tokens` in chunks of `rows` through `fixed_rows_forward` (same caches as feeding
    them one at a time, at the same row count)."""
    for i in range(0, len(tokens), rows):
        fixed_rows_forward(model, cache, tokens[i:i + rows], rows, cache_arg=cache_arg,
                           device=device)


def crop_rejected(cache: Any, num_fed: int, num_kept: int) -> None:
    """After a verify forward that fed `num_fed` tokens, keep the first `num_kept` of them."""
    if num_fed > num_kept:
        cache.crop(-(num_fed - num_kept))
