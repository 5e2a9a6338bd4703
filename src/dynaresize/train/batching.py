"""Micro-batch planning for one training step: pure functions, no distributed calls.

- `make_micro_batches(samples, micro_batch_size)`: a step's `TrainSample`s → micro-batches,
  sorted by (prompt, sample) and cut in fixed chunks. Their composition depends on the samples
  and the micro-batch size only, never on the number of training ranks (design §2.4).
- `deal(num_micro_batches, num_ranks)`: micro-batch i → rank i mod R, each rank's list padded
  with None so every rank runs the same number of forward/backward rounds (FSDP collectives
  need equal call counts on every rank).
- `plan_step(samples, micro_batch_size, num_ranks, max_tokens_per_micro_batch=0)`: both at
  once; element r is what training rank r passes to `FSDPTrainer.train_step`. With a token
  budget (> 0) the plan is `balance.balanced_plan` instead: token-budgeted micro-batches,
  balanced over the ranks by LPT, each carrying its global index.
- `global_num_tokens(samples)`: the model-token count the loss is divided by.
- `pack(micro_batch)`: samples → right-padded tensors (`PackedBatch`), positions aligned so that
  position j holds what is needed to score token j + 1. A sample's `response_mask` (episodes)
  keeps the environment's tokens out of the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dynaresize.core.types import TrainSample
from dynaresize.train.balance import balanced_plan, ordered_step_samples

if TYPE_CHECKING:
    import torch

MicroBatch = list[TrainSample]


def make_micro_batches(samples: Sequence[TrainSample], micro_batch_size: int) -> list[MicroBatch]:
    """Sort by (prompt, sample) and cut into chunks of exactly `micro_batch_size` samples."""
    if micro_batch_size <= 0:
        raise ValueError(f"micro_batch_size must be > 0, got {micro_batch_size}")
    ordered = ordered_step_samples(samples)
    if len(ordered) % micro_batch_size:
        raise ValueError(f"{len(ordered)} samples do not split into micro-batches of "
                         f"{micro_batch_size}")
    return [ordered[i:i + micro_batch_size] for i in range(0, len(ordered), micro_batch_size)]


def deal(num_micro_batches: int, num_ranks: int) -> list[list[int | None]]:
    """For each rank, the micro-batch indices it processes (round-robin), None-padded so that
    every rank has ceil(num_micro_batches / num_ranks) rounds."""
    if num_micro_batches < 0:
        raise ValueError(f"num_micro_batches must be >= 0, got {num_micro_batches}")
    if num_ranks <= 0:
        raise ValueError(f"num_ranks must be > 0, got {num_ranks}")
    num_rounds = -(-num_micro_batches // num_ranks)
    plan: list[list[int | None]] = [[] for _ in range(num_ranks)]
    for round_index in range(num_rounds):
        for rank in range(num_ranks):
            i = round_index * num_ranks + rank
            plan[rank].append(i if i < num_micro_batches else None)
    return plan


def plan_step(samples: Sequence[TrainSample], micro_batch_size: int, num_ranks: int,
              max_tokens_per_micro_batch: int = 0) -> list[list[MicroBatch | None]]:
    """Per training rank, the micro-batches (None: padding round) for `train_step`: fixed
    counts dealt round-robin, or (`max_tokens_per_micro_batch` > 0) the balanced plan."""
    if max_tokens_per_micro_batch > 0:
        return balanced_plan(samples, max_tokens_per_micro_batch,  # type: ignore[return-value]
                             num_ranks)
    micro_batches = make_micro_batches(samples, micro_batch_size)
    return [[None if i is None else micro_batches[i] for i in indices]
            for indices in deal(len(micro_batches), num_ranks)]


def global_num_tokens(samples: Sequence[TrainSample]) -> int:
    """Model tokens of the whole global batch (every response token of a single-turn
    sample; an episode's masked ones): the loss's denominator."""
    return sum(s.num_model_tokens for s in samples)


@dataclass
class PackedBatch:
    """A micro-batch as tensors, all [B, L] (L = longest prompt + response in the batch).

    Position j of `targets`, `loss_mask`, `old_logprobs` and `advantages` describes token j + 1
    of `input_ids` (what the logits at position j predict); the last column is always masked.
    """

    input_ids: torch.Tensor
    """int64, prompt + response, right-padded with `pad_token_id`."""
    attention_mask: torch.Tensor
    """int64, 1 on real tokens."""
    targets: torch.Tensor
    """int64, input_ids shifted left by one."""
    loss_mask: torch.Tensor
    """bool, True where the target is a response token."""
    old_logprobs: torch.Tensor
    """float32, behaviour log-prob of the target token (0 where masked)."""
    advantages: torch.Tensor
    """float32, the sample's advantage on its response tokens (0 where masked)."""

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())


def pack(micro_batch: Sequence[TrainSample], pad_token_id: int = 0) -> PackedBatch:
    """Samples → right-padded tensors on CPU (see `PackedBatch` for the alignment)."""
    if not micro_batch:
        raise ValueError("cannot pack an empty micro-batch")
    for s in micro_batch:
        if not s.prompt_tokens:
            raise ValueError(f"sample (prompt={s.prompt}, sample={s.sample}) has no prompt")
        if len(s.behavior_logprobs) != len(s.response_tokens):
            raise ValueError(f"sample (prompt={s.prompt}, sample={s.sample}) has "
                             f"{len(s.response_tokens)} tokens but "
                             f"{len(s.behavior_logprobs)} behavior log-probs")
        if s.response_mask is not None and len(s.response_mask) != len(s.response_tokens):
            raise ValueError(f"sample (prompt={s.prompt}, sample={s.sample}) has "
                             f"{len(s.response_tokens)} tokens but {len(s.response_mask)} "
                             "response mask entries")
    length = max(len(s.prompt_tokens) + len(s.response_tokens) for s in micro_batch)
    size = len(micro_batch)
    import torch

    input_ids = torch.full((size, length), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((size, length), dtype=torch.int64)
    loss_mask = torch.zeros((size, length), dtype=torch.bool)
    old_logprobs = torch.zeros((size, length), dtype=torch.float32)
    advantages = torch.zeros((size, length), dtype=torch.float32)
    for row, s in enumerate(micro_batch):
        num_prompt, num_response = len(s.prompt_tokens), len(s.response_tokens)
        total = num_prompt + num_response
        input_ids[row, :total] = torch.tensor(list(s.prompt_tokens) + list(s.response_tokens))
        attention_mask[row, :total] = 1
        # Response token t sits at position num_prompt + t; logits at position - 1 predict it.
        span = slice(num_prompt - 1, total - 1)
        loss_mask[row, span] = True
        old_logprobs[row, span] = torch.tensor(s.behavior_logprobs, dtype=torch.float32)
        advantages[row, span] = float(s.advantage)
        if s.response_mask is not None:  # environment tokens: no loss, no advantage
            keep = torch.tensor(s.response_mask, dtype=torch.bool)
            loss_mask[row, span] &= keep
            old_logprobs[row, span] *= keep
            advantages[row, span] *= keep
    targets = torch.full_like(input_ids, pad_token_id)
    targets[:, :-1] = input_ids[:, 1:]
    return PackedBatch(input_ids, attention_mask, targets, loss_mask, old_logprobs, advantages)
