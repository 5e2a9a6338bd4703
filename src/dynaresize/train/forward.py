"""One micro-batch through a policy model: its GRPO loss and statistics. No distributed calls.

`micro_batch_loss` is the single definition of a micro-batch's loss, used by both update paths
of `FSDPTrainer`: the FSDP path calls it on the sharded model (its forward all-gathers
parameters, so every rank must run the same number of calls), the exact path
(`train.exact`) on a plain, unsharded replica (purely local).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dynaresize.core.types import TrainSample
from dynaresize.train.batching import MicroBatch, PackedBatch, pack
from dynaresize.train.grpo import (
    clipped_token_count,
    kl_penalty_sum,
    ppo_clip_loss_sum,
    token_logprobs,
)

STAT_KEYS = ("pg_loss_sum", "kl_sum", "tokens", "clipped_tokens")
"""Order of the float64 statistics vector `micro_batch_loss` returns."""


@dataclass(frozen=True)
class LossSpec:
    """What the loss of a micro-batch depends on besides the model and the samples."""

    clip_eps: float
    kl_coef: float
    temperature: float = 1.0
    pad_token_id: int = 0


def padding_micro_batch() -> MicroBatch:
    """One 1-token sample: run with loss weight 0 so a rank's collectives line up."""
    return [TrainSample(step=-1, prompt=-1, sample=-1, prompt_tokens=[0], response_tokens=[0],
                        behavior_logprobs=[0.0], advantage=0.0, reward=0.0)]


def logprobs_of(model: nn.Module, batch: PackedBatch, temperature: float,
                device: torch.device) -> torch.Tensor:
    """Log-probs [B, L] of `batch.targets` under `model` at `temperature`."""
    # No attention mask: right padding never precedes a real token under causal attention.
    logits = model(input_ids=batch.input_ids.to(device), use_cache=False).logits
    if temperature != 1.0:
        logits = logits.float() / temperature
    return token_logprobs(logits, batch.targets.to(device))


def micro_batch_loss(model: nn.Module, ref_model: nn.Module | None, micro_batch: MicroBatch,
                     spec: LossSpec, device: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss_sum, stats) of one micro-batch. loss_sum: differentiable token SUM of the PPO-clip
    loss plus `kl_coef` x the KL sum to `ref_model` (None: no KL term); the caller scales it.
    stats: float64 [4] in `STAT_KEYS` order, detached."""
    batch = pack(micro_batch, spec.pad_token_id)
    mask = batch.loss_mask.to(device)
    old = batch.old_logprobs.to(device)
    logprobs = logprobs_of(model, batch, spec.temperature, device)
    pg_sum = ppo_clip_loss_sum(logprobs, old, batch.advantages.to(device), mask, spec.clip_eps)
    loss_sum = pg_sum
    kl_sum = torch.zeros((), device=device)
    if ref_model is not None:
        with torch.no_grad():
            ref_logprobs = logprobs_of(ref_model, batch, spec.temperature, device)
        kl_sum = kl_penalty_sum(logprobs, ref_logprobs, mask)
        loss_sum = loss_sum + spec.kl_coef * kl_sum
    clipped = clipped_token_count(logprobs, old, mask, spec.clip_eps)
    stats = torch.stack([pg_sum.detach(), kl_sum.detach(), mask.sum(), clipped])
    return loss_sum, stats.to(torch.float64)
