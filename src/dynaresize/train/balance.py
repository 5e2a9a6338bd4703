"""Token-budgeted micro-batches, balanced over the training ranks (pure; no torch, no devices).

`train.max_tokens_per_micro_batch > 0` replaces the fixed-count micro-batches of
`batching.make_micro_batches` with:

- a partition that is a function of the samples only (never of the number of ranks): each
  GRPO group (the samples of one prompt, by sample index) is cut greedily into consecutive
  micro-batches of at most `max_tokens` tokens (prompt + response; a longer sample is a
  micro-batch alone). Micro-batches never span groups, so one is complete as soon as its group
  is (streaming training, `dynaresize.core.stream`), and a group of long samples becomes several
  micro-batches that several ranks can share;
- global indices in (prompt, position in the group) order, sparse: the j-th micro-batch of
  the p-th prompt (sorted ids) is slot p x G + j (G the group size, the most micro-batches a
  group can be cut into; `slot_index`), so an index is known as soon as its group is, before
  the others (streaming). Exact reduction sums the micro-batch gradients in index order and
  skips the empty slots (`train.exact`), so the update is the same whatever the number of
  ranks, whichever rank computes which micro-batch, and whether it streamed;
- an assignment by LPT (longest processing time first) on token counts: micro-batches in
  decreasing size (ties by index) each go to the rank with the fewest tokens so far (ties:
  the lowest rank). Deterministic. Each rank's list runs largest first, so the ranks' k-th
  micro-batches are of similar size (FSDP's collectives run them in lock-step rounds).

`IndexedMicroBatch` carries its global index to `FSDPTrainer.train_step` (a plain list of
samples otherwise: devices, packing and the twin's costs treat it as one).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from dynaresize.core.types import TrainSample

MicroBatchList = list[TrainSample]


class IndexedMicroBatch(list[TrainSample]):
    """A micro-batch (list of samples) that knows its global index in the step's partition."""

    def __init__(self, samples: Sequence[TrainSample], global_index: int) -> None:
        super().__init__(samples)
        self.global_index = global_index

    def __reduce__(self) -> tuple:  # pickles (Ray) with its index
        return (IndexedMicroBatch, (list(self), self.global_index))


def sample_tokens(sample: TrainSample) -> int:
    """Tokens a sample trains on (prompt + response). The twin's samples (`dynaresize.sim`)
    carry no token lists: no log-probs, and prompt and response each a one-element stand-in
    holding its length; those count their lengths."""
    if not sample.behavior_logprobs and len(sample.prompt_tokens) == 1 \
            and len(sample.response_tokens) == 1:
        return sample.prompt_tokens[0] + sample.response_tokens[0]
    return len(sample.prompt_tokens) + len(sample.response_tokens)


def cut_group(token_counts: Sequence[int], max_tokens: int) -> list[int]:
    """Sizes of the consecutive chunks a group of samples with these token counts is cut into:
    greedy, a chunk closes when the next sample would take it past `max_tokens` (a sample
    longer than the budget is a chunk alone)."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    sizes: list[int] = []
    size = tokens = 0
    for n in token_counts:
        if size and tokens + n > max_tokens:
            sizes.append(size)
            size = tokens = 0
        size += 1
        tokens += n
    if size:
        sizes.append(size)
    return sizes


def slot_index(prompt_position: int, group_size: int, chunk: int) -> int:
    """The global index of a group's `chunk`-th micro-batch (module docstring)."""
    return prompt_position * group_size + chunk


def num_slots(num_prompts: int, group_size: int) -> int:
    """The index space of a step (what `train_finish` gets as its number of micro-batches)."""
    return num_prompts * group_size


def ordered_step_samples(samples: Sequence[TrainSample]) -> list[TrainSample]:
    """One step's samples sorted by (prompt, sample); ValueError if empty, of several steps, or
    with a duplicate (prompt, sample)."""
    if not samples:
        raise ValueError("a training step needs at least one sample")
    steps = {s.step for s in samples}
    if len(steps) != 1:
        raise ValueError(f"samples of one training step expected, got steps {sorted(steps)}")
    ordered = sorted(samples, key=lambda s: (s.prompt, s.sample))
    keys = [(s.prompt, s.sample) for s in ordered]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate (prompt, sample) in a training step")
    return ordered


def token_micro_batches(samples: Sequence[TrainSample],
                        max_tokens: int) -> list[tuple[int, MicroBatchList]]:
    """The step's partition (module docstring) as (slot index, micro-batch), in index order."""
    ordered = ordered_step_samples(samples)
    groups: dict[int, list[TrainSample]] = {}
    for s in ordered:
        groups.setdefault(s.prompt, []).append(s)
    group_size = max(len(g) for g in groups.values())
    out: list[tuple[int, MicroBatchList]] = []
    for position, group in enumerate(groups.values()):
        start = 0
        for chunk, size in enumerate(cut_group([sample_tokens(s) for s in group], max_tokens)):
            out.append((slot_index(position, group_size, chunk), group[start:start + size]))
            start += size
    return out


def lpt_assign(costs: Sequence[int], num_ranks: int) -> list[list[int]]:
    """Per rank, the item indices LPT gives it (module docstring), largest first."""
    if num_ranks <= 0:
        raise ValueError(f"num_ranks must be > 0, got {num_ranks}")
    heap = [(0, rank) for rank in range(num_ranks)]
    plan: list[list[int]] = [[] for _ in range(num_ranks)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, rank = heapq.heappop(heap)
        plan[rank].append(i)
        heapq.heappush(heap, (load + costs[i], rank))
    return plan


def balanced_plan(samples: Sequence[TrainSample], max_tokens: int,
                  num_ranks: int) -> list[list[IndexedMicroBatch | None]]:
    """Per training rank, its token-budgeted micro-batches (LPT), None-padded so that every
    rank runs the same number of rounds."""
    micro_batches = token_micro_batches(samples, max_tokens)
    tokens = [sum(sample_tokens(s) for s in mb) for _, mb in micro_batches]
    assignment = lpt_assign(tokens, num_ranks)
    num_rounds = max(len(indices) for indices in assignment)
    return [[IndexedMicroBatch(micro_batches[i][1], micro_batches[i][0]) for i in indices]
            + [None] * (num_rounds - len(indices)) for indices in assignment]


def rank_tokens(plan: Sequence[Sequence[Sequence[TrainSample] | None]]) -> list[int]:
    """Tokens each rank of a plan trains on."""
    return [sum(sample_tokens(s) for mb in rank if mb for s in mb) for rank in plan]
