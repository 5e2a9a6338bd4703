"""Trainer: GRPO/PPO-clip loss (`grpo`, pure), micro-batch planning (`batching`, pure) and the
FSDP2 trainer over one training group (`trainer`, the only module with collectives)."""

from dynaresize.train.batching import (
    PackedBatch,
    deal,
    global_num_tokens,
    make_micro_batches,
    pack,
    plan_step,
)
from dynaresize.train.grpo import (
    clipped_token_count,
    group_advantages,
    kl_penalty_sum,
    ppo_clip_loss_sum,
    token_logprobs,
)
from dynaresize.train.trainer import FSDPTrainer, checksum_named_tensors

__all__ = [
    "FSDPTrainer",
    "PackedBatch",
    "checksum_named_tensors",
    "clipped_token_count",
    "deal",
    "global_num_tokens",
    "group_advantages",
    "kl_penalty_sum",
    "make_micro_batches",
    "pack",
    "plan_step",
    "ppo_clip_loss_sum",
    "token_logprobs",
]
