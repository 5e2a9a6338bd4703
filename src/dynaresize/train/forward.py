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
    token_entropy,
    token_logprobs,
)

STAT_KEYS = ("pg_loss_sum", "kl_sum", "tokens", "clipped_tokens", "sequences", "groups",
             "entropy_sum")
"""Order of the float64 statistics vector `micro_batch_loss` returns (sums: every one adds
up exactly over micro-batches in index order)."""
NUM_STATS = len(STAT_KEYS)


@dataclass(frozen=True)
class LossSpec:
    """What the loss of a micro-batch depends on besides the model and the samples
    (`train.loss`, docs/recipes.md). The defaults are the original GRPO/PPO-clip loss."""

    clip_eps: float
    kl_coef: float
    temperature: float = 1.0
    pad_token_id: int = 0
    clip_high: float | None = None
    """Upper clip range (None: clip_eps)."""
    aggregation: str = "token"
    ratio: str = "token"
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    max_new_tokens: int = 0
    """'constant' aggregation: the response cap in its normaliser."""


def loss_spec(config: object, temperature: float, pad_token_id: int,
              max_new_tokens: int) -> LossSpec:
    """The `LossSpec` of a `TrainConfig` (its `loss` table)."""
    loss = config.loss  # type: ignore[attr-defined]
    clip_eps = loss.clip_low or config.clip_eps  # type: ignore[attr-defined]
    return LossSpec(clip_eps, config.kl_coef, temperature,  # type: ignore[attr-defined]
                    pad_token_id, loss.clip_high or None, loss.aggregation, loss.ratio,
                    loss.kl_estimator, loss.entropy_coef, max_new_tokens)


def row_weights(micro_batch: MicroBatch, aggregation: str) -> torch.Tensor | None:
    """[B, 1] weight of each sample's tokens in the loss SUM (None: 1 each): 'sequence' 1 /
    its model tokens (`TrainSample.num_model_tokens`), 'group' 1 / its group's response
    tokens. A function of the sample (and its group) only, so a micro-batch's loss never
    depends on the others."""
    if aggregation in ("token", "constant"):
        return None
    if aggregation == "sequence":
        counts = [s.num_model_tokens for s in micro_batch]
    elif aggregation == "group":
        counts = [s.group_tokens for s in micro_batch]
        if any(c <= 0 for c in counts):
            raise ValueError("'group' aggregation needs samples that know their group's "
                             "tokens (TrainSample.group_tokens, set by core.samples)")
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}")
    return torch.tensor([[1.0 / max(1, c)] for c in counts], dtype=torch.float32)


def loss_denominator(stats: torch.Tensor, spec: LossSpec) -> int:
    """What the step's summed gradient is divided by, from the step's summed statistics (so
    a function of the whole batch, the same on every rank): response tokens ('token'),
    sequences ('sequence'), groups ('group') or sequences x max_new_tokens ('constant')."""
    tokens, sequences, groups = int(stats[2]), int(stats[4]), int(stats[5])
    if spec.aggregation == "sequence":
        return sequences
    if spec.aggregation == "group":
        return groups
    if spec.aggregation == "constant":
        return sequences * spec.max_new_tokens
    return tokens


def padding_micro_batch() -> MicroBatch:
    """One 1-token sample: run with loss weight 0 so a rank's collectives line up. It is a
    group of its own (`group_tokens` 1), so every aggregation weighs it (by 0) without
    error: with 'group' a rank with a padding round used to raise, so a step trained on one
    trainer and failed on two."""
    return [TrainSample(step=-1, prompt=-1, sample=-1, prompt_tokens=[0], response_tokens=[0],
                        behavior_logprobs=[0.0], advantage=0.0, reward=0.0, group_tokens=1)]


def logprobs_of(model: nn.Module, batch: PackedBatch, temperature: float,
                device: torch.device) -> torch.Tensor:
    """Log-probs [B, L] of `batch.targets` under `model` at `temperature`."""
    return _forward(model, batch, temperature, device, entropy=False)[0]


def _forward(model: nn.Module, batch: PackedBatch, temperature: float, device: torch.device,
             entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs [B, L] of the targets, token entropies [B, L] if `entropy`)."""
    # No attention mask: right padding never precedes a real token under causal attention.
    logits = model(input_ids=batch.input_ids.to(device), use_cache=False).logits
    if temperature != 1.0:
        logits = logits.float() / temperature
    logprobs = token_logprobs(logits, batch.targets.to(device))
    return logprobs, token_entropy(logits) if entropy else None


def micro_batch_loss(model: nn.Module, ref_model: nn.Module | None, micro_batch: MicroBatch,
                     spec: LossSpec, device: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss_sum, stats) of one micro-batch. loss_sum: differentiable weighted token SUM
    (`row_weights`) of the PPO-clip loss plus `kl_coef` x the KL sum to `ref_model` (None: no
    KL term) minus `entropy_coef` x the entropy sum; the caller divides by
    `loss_denominator`. stats: float64 [NUM_STATS] in `STAT_KEYS` order, detached."""
    batch = pack(micro_batch, spec.pad_token_id)
    mask = batch.loss_mask.to(device)
    old = batch.old_logprobs.to(device)
    weights = row_weights(micro_batch, spec.aggregation)
    weights = weights.to(device) if weights is not None else None
    seq_ratio = spec.ratio == "sequence"
    logprobs, entropy = _forward(model, batch, spec.temperature, device,
                                 entropy=spec.entropy_coef > 0)
    pg_sum = ppo_clip_loss_sum(logprobs, old, batch.advantages.to(device), mask, spec.clip_eps,
                               spec.clip_high, weights, seq_ratio)
    loss_sum = pg_sum
    kl_sum = torch.zeros((), device=device)
    if ref_model is not None:
        with torch.no_grad():
            ref_logprobs = logprobs_of(ref_model, batch, spec.temperature, device)
        kl_sum = kl_penalty_sum(logprobs, ref_logprobs, mask, spec.kl_estimator, weights)
        loss_sum = loss_sum + spec.kl_coef * kl_sum
    entropy_sum = torch.zeros((), device=device)
    if entropy is not None:
        entropy_sum = torch.where(mask, entropy * weights if weights is not None else entropy,
                                  torch.zeros_like(entropy)).sum()
        loss_sum = loss_sum - spec.entropy_coef * entropy_sum
    clipped = clipped_token_count(logprobs, old, mask, spec.clip_eps, spec.clip_high, seq_ratio)
    sequences = float(len(micro_batch))
    groups = float(sum(1 for s in micro_batch if s.sample == 0))
    stats = torch.stack([pg_sum.detach().double(), kl_sum.detach().double(),
                         mask.sum().double(), clipped.double(),
                         torch.tensor(sequences, dtype=torch.float64, device=device),
                         torch.tensor(groups, dtype=torch.float64, device=device),
                         entropy_sum.detach().double()])
    return loss_sum, stats
