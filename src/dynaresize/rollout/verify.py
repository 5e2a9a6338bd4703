"""Fixed-row forwards: logits that do not depend on how many positions a forward carries.

Exact speculative decoding verifies k draft tokens in one forward and keeps a draft only if it
equals the token the sampler draws there, so the k-position forward's logits must equal, bit
for bit, those of decoding one position at a time. On CPU they do not by default: a matrix
product with one row runs another kernel (gemv) than one with several, and SDPA's attention
kernel rounds differently by query length (measured: docs/speculative.md).

The route taken here: every forward of a request, speculative or not, prompt chunk or decode
step, feeds exactly `rows` positions (the real tokens, then padding that repeats the last one;
the cache is cropped back to the real tokens afterwards), with eager attention (plain matmul +
softmax). Causal masking keeps the real rows blind to the padding, and past two small-shape
regimes (`MIN_ROWS`, `MIN_KEYS`) each row's arithmetic is the same whatever the other rows hold
and however many masked keys follow: measured bitwise on the tiny Qwen2 and on SmolLM2-135M, at
any split of a sequence into chunks of 1..rows tokens (tests/unit/test_engine_speculative.py).
"""

from __future__ import annotations

from typing import Any

import torch

from dynaresize.rollout.speculative import MIN_ROWS


def use_row_invariant_attention(model: torch.nn.Module) -> None:
    """Switch `model` (a transformers model) to eager attention (SDPA's CPU kernel is not
    invariant in the query length)."""
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        setter("eager")
    else:  # older transformers
        model.config._attn_implementation = "eager"


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
