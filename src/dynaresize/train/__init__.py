"""Trainer: GRPO/PPO-clip loss (`grpo`, pure), micro-batch planning (`batching`, pure, no
torch at import), one micro-batch's loss (`forward`) and the FSDP2 trainer over one training
group (`trainer`, with its state in `state` and its exact-reduction path in `exact`: the
modules with collectives). Names are re-exported lazily so that `dynaresize.train.batching`
stays light."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PackedBatch": "batching", "deal": "batching", "global_num_tokens": "batching",
    "make_micro_batches": "batching", "pack": "batching", "plan_step": "batching",
    "clipped_token_count": "grpo", "group_advantages": "grpo", "kl_penalty_sum": "grpo",
    "ppo_clip_loss_sum": "grpo", "token_logprobs": "grpo",
    "FSDPTrainer": "trainer", "checksum_named_tensors": "trainer", "HeldGradients": "held",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dynaresize.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dynaresize.train.{_EXPORTS[name]}"), name)
