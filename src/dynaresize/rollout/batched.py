"""The builtin engine's batched decode (`batch_invariant=False`): one left-padded forward over
every running request's own KV cache.

Each request keeps its own `DynamicCache`; an iteration pads copies of them into one batch
(padding on the left, masked out), feeds every request's next input at its own position, then
appends the new keys and values to each request's own cache. Log-probs are exact up to float
rounding, but a request's tokens may depend on its batch (`rollout.engine`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache


def batched_decode(model: torch.nn.Module, caches: Sequence[DynamicCache],
                   next_inputs: Sequence[int], *, cache_arg: str,
                   device: torch.device) -> list[torch.Tensor]:
    """Feed `next_inputs[i]` after the tokens of `caches[i]`, all in one left-padded batch;
    append the new keys/values to each cache; return each request's last logits. `cache_arg`:
    the model's name of its KV cache argument."""
    lengths = [c.get_seq_length() for c in caches]
    max_len = max(lengths)
    data = []
    if max_len > 0:
        ref = next(c.layers for c, n in zip(caches, lengths) if n > 0)
        for i in range(len(ref)):
            kv = []
            for name in ("keys", "values"):
                pad = getattr(ref[i], name)[:, :, :0]
                rows = [getattr(c.layers[i], name) if n else pad
                        for c, n in zip(caches, lengths)]
                kv.append(torch.cat([torch.nn.functional.pad(t, (0, 0, max_len - n, 0))
                                     for t, n in zip(rows, lengths)]))
            data.append(tuple(kv))
    batch = DynamicCache(ddp_cache_data=data) if data else DynamicCache()
    mask = torch.ones(len(caches), max_len + 1, dtype=torch.long, device=device)
    for row, n in enumerate(lengths):
        mask[row, : max_len - n] = 0
    out = model(input_ids=torch.tensor([[t] for t in next_inputs], device=device),
                position_ids=torch.tensor([[n] for n in lengths], device=device),
                attention_mask=mask, use_cache=True, **{cache_arg: batch})
    for row, cache in enumerate(caches):
        for i, layer in enumerate(batch.layers):
            new = slice(row, row + 1), slice(None), slice(-1, None)
            cache.update(layer.keys[new], layer.values[new], i)
    return list(out.logits[:, -1])
