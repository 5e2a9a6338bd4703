"""DAPO dynamic sampling, planned purely (no asyncio, no devices, no clock).

A group whose rewards are all equal has zero advantage everywhere: it costs rollout and
training and teaches nothing. With `train.dynamic_sampling.enabled`, a step keeps B =
`task.prompts_per_step` groups WITH a reward signal (non-zero variance) out of a larger,
seeded draw, and the rest are recorded as dropped. Everything here is a function of the seed
and the rewards only, never of timing, so the records contract (design §2) holds under any
allocation and resize schedule:

- the step's prompt STREAM is `source.batch(step, B x max_rounds, seed)` (always the same
  size, so streams of different steps never share prompts), in its seeded order;
- the step dispatches the first `initial_for(f)` prompts up front, f being the filter rate of
  an earlier step whose records are final before this step's rollout starts (`rate_step`:
  step k - 1 - staleness), then ONE more prompt each time a finished group has no signal
  (`TopUp`): extra prompts are dispatched while the first ones run, not after;
- the step's batch is the first N prompts of the stream, N = max(initial, the smallest n
  whose first n prompts hold B groups with a signal), or the whole stream if it holds fewer
  (`TopUp.batch_size`): a function of the seed and the rewards only. Prompts dispatched
  beyond N (how many depends on timing) are discarded: not trained, not recorded;
- which groups of the batch train (`select_groups`): the first B groups with a signal in
  stream order; if the batch holds fewer, the first groups without one fill it (their
  advantages are 0: no policy-gradient term, only KL/entropy), so the step always trains B
  groups (micro-batching needs a fixed size); the others are recorded as dropped.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynaresize.core.advantages import AdvantageSpec
from dynaresize.core.samples import Records, StepSamples, assemble_step
from dynaresize.core.types import Completion


@dataclass(frozen=True)
class DynamicSampling:
    """`[train.dynamic_sampling]` as the planner sees it."""

    groups_per_step: int
    """B: groups the step trains on (task.prompts_per_step)."""
    max_rounds: int
    """Cap: at most this many rounds of B prompts per step."""
    margin: float = 0.0
    """Dispatch B x (1 + margin x f) / (1 - f) prompts up front (`initial_for`)."""

    def __post_init__(self) -> None:
        if self.groups_per_step <= 0 or self.max_rounds <= 0 or self.margin < 0:
            raise ValueError(f"bad dynamic sampling plan {self}")

    @property
    def pool_size(self) -> int:
        """Prompts in the step's stream (`source.batch(step, pool_size, seed)`)."""
        return self.groups_per_step * self.max_rounds

    def initial_for(self, filter_rate: float | None) -> int:
        """Prompts to dispatch up front when a fraction `filter_rate` (f) of groups is
        expected to have no signal: B / (1 - f) for B groups with one, plus `margin` times
        the expected groups without (B f / (1 - f)), in [B, pool_size] (None: not known
        yet, B). At f = 0 exactly B: a margin only where groups are filtered."""
        if filter_rate is None:
            return self.groups_per_step
        if filter_rate >= 1.0:
            return self.pool_size
        need = self.groups_per_step * (1.0 + self.margin * filter_rate) / (1.0 - filter_rate)
        return max(self.groups_per_step, min(self.pool_size, math.ceil(need - 1e-9)))


def rate_step(step: int, staleness: int) -> int | None:
    """The step whose filter rate plans step `step`'s rounds: the newest one whose rollout has
    ended before step `step`'s starts (step - 1 - staleness); None for the first steps."""
    earlier = step - 1 - staleness
    return earlier if earlier >= 0 else None


def has_signal(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards are not all equal (non-zero variance)."""
    return any(r != rewards[0] for r in rewards)


def filter_rate(groups: Mapping[int, Sequence[float]]) -> float:
    """Fraction of the groups without a signal (0 for no groups)."""
    if not groups:
        return 0.0
    return sum(1 for r in groups.values() if not has_signal(r)) / len(groups)


def filter_rates_of(records: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """step -> filter rate, from a run's sample records (samples.jsonl): the records of a
    dynamic-sampling step are every group of its batch, kept or not (`assemble_dynamic`), so
    this is the rate that step measured. A resumed run plans its first steps' up-front counts
    from these, as the uninterrupted run did. Steps without `kept` records are left out."""
    groups: dict[int, dict[int, list[float]]] = {}
    for r in records:
        if "kept" in r:
            groups.setdefault(int(r["step"]), {}).setdefault(int(r["prompt"]), []).append(
                float(r["reward"]))
    return {step: filter_rate(by_prompt) for step, by_prompt in groups.items()}


def resumed_filter_rates(records: Sequence[Mapping[str, Any]],
                         saved: Mapping[str, float]) -> dict[int, float]:
    """step -> filter rate for a resumed run: those its records show (`filter_rates_of`),
    replaced by the ones its checkpoint kept (`saved`, step as a string -> rate). The records
    round rewards to 6 decimals, so a group whose rewards differ by less shows no signal
    there though it had one when the step ran; the checkpoint keeps the exact rates of the
    steps the resumed run plans from (`kept_filter_rates`), older checkpoints none."""
    return filter_rates_of(records) | {int(step): float(rate) for step, rate in saved.items()}


def kept_filter_rates(rates: Mapping[int, float], num_steps: int,
                      staleness: int) -> dict[str, float]:
    """The rates a checkpoint after `num_steps` steps keeps (JSON keys): those of the steps
    that plan a resumed run's steps (`rate_step` of step `num_steps` and later)."""
    first = num_steps - 1 - staleness
    return {str(step): rates[step] for step in sorted(rates) if first <= step < num_steps}


def select_groups(order: Sequence[int], groups: Mapping[int, Sequence[float]],
                  num_groups: int) -> tuple[list[int], list[int]]:
    """(kept, dropped) prompt ids, each in `order` (the seeded pool order): the first
    `num_groups` with a signal, topped up with the first ones without (module docstring)."""
    if set(order) != set(groups) or len(order) != len(groups):
        raise ValueError(f"{len(groups)} rewarded groups for an order of {len(order)} prompts")
    if num_groups > len(order):
        raise ValueError(f"{num_groups} groups wanted out of {len(order)}")
    keep = kept_of({p: has_signal(groups[p]) for p in order}, order, num_groups)
    return [p for p in order if p in keep], [p for p in order if p not in keep]


def kept_of(signal: Mapping[int, bool], order: Sequence[int], num_groups: int) -> set[int]:
    """The kept prompts given each group's signal (`select_groups`' rule)."""
    chosen = [p for p in order if signal[p]][:num_groups]
    if len(chosen) < num_groups:
        chosen += [p for p in order if not signal[p]][:num_groups - len(chosen)]
    return set(chosen)


class TopUp:
    """A step's live top-up (module docstring): which stream prompts to dispatch as groups
    finish, and the step's batch once every dispatched group has finished. Dispatching stops
    early once the known signals bound the batch (prompts past it would be discarded)."""

    def __init__(self, order: Sequence[int], num_groups: int, initial: int) -> None:
        if not num_groups <= initial <= len(order):
            raise ValueError(f"initial = {initial}: must be in [{num_groups}, {len(order)}]")
        self.order = list(order)
        self.num_groups = num_groups
        self.initial = initial
        self.num_dispatched = initial
        self.signal: dict[int, bool] = {}
        self._position = {p: i for i, p in enumerate(self.order)}
        self._signal_at: list[int] = []
        """Stream positions of the finished groups with a signal, sorted."""

    def first(self) -> list[int]:
        """The prompts dispatched up front."""
        return self.order[:self.initial]

    @property
    def done(self) -> bool:
        """Every dispatched group has finished (nothing more will be dispatched)."""
        return len(self.signal) == self.num_dispatched

    def complete(self, prompt: int, signal: bool) -> list[int]:
        """A group finished; returns the prompts to dispatch now (one more if it has no
        signal and the batch may still need it)."""
        if prompt in self.signal:
            raise ValueError(f"group {prompt} completed twice")
        self.signal[prompt] = signal
        if signal:
            bisect.insort(self._signal_at, self._position[prompt])
            return []
        if self.num_dispatched >= self._bound():
            return []
        self.num_dispatched += 1
        return [self.order[self.num_dispatched - 1]]

    def _bound(self) -> int:
        """An upper bound of `batch_size` from the signals known so far."""
        if len(self._signal_at) < self.num_groups:
            return len(self.order)
        return max(self.initial, self._signal_at[self.num_groups - 1] + 1)

    def batch_size(self) -> int:
        """N (module docstring); once `done`."""
        if not self.done:
            raise ValueError(f"{self.num_dispatched - len(self.signal)} groups unfinished")
        return min(self._bound(), self.num_dispatched)

    def batch(self) -> list[int]:
        """The step's batch: the first `batch_size` prompts of the stream."""
        return self.order[:self.batch_size()]


class KeepTracker:
    """Streaming training with dynamic sampling: which groups are KNOWN to be kept as groups
    complete in any order. `order` is the step's whole stream: a complete group with a
    signal is kept for sure once fewer than `num_groups` groups before it can have a signal
    (the finished ones with a signal plus the unfinished or undispatched ones); the rest is
    known at `seal`, once the batch is (`TopUp.batch_size`). The groups released over a step
    are exactly `select_groups`' kept ones of the batch, whatever the completion order."""

    def __init__(self, order: Sequence[int], num_groups: int) -> None:
        self.order = list(order)
        self.num_groups = num_groups
        self.signal: dict[int, bool] = {}
        self.released: set[int] = set()

    def complete(self, prompt: int, signal: bool) -> list[int]:
        """Record a complete group; returns the groups newly known to be kept (pool order)."""
        if prompt in self.signal:
            raise ValueError(f"group {prompt} completed twice")
        self.signal[prompt] = signal
        out, possible = [], 0  # groups before p that can have a signal
        for p in self.order:
            if possible >= self.num_groups:
                break
            known = self.signal.get(p)
            if known and p not in self.released:
                out.append(p)
            if known is None or known:
                possible += 1
        self.released.update(out)
        return out

    def seal(self, batch_size: int) -> list[int]:
        """The batch is the first `batch_size` prompts, all complete: the kept ones not
        released yet (pool order)."""
        batch = self.order[:batch_size]
        if any(p not in self.signal for p in batch):
            raise ValueError(f"sealed with groups of the first {batch_size} unfinished")
        keep = kept_of(self.signal, batch, self.num_groups)
        out = [p for p in batch if p in keep and p not in self.released]
        self.released.update(out)
        return out


def assemble_dynamic(step: int, version: int, order: Sequence[int],
                     completions: list[Completion], rewards: Mapping[tuple[int, int], float],
                     samples_per_prompt: int, num_groups: int, rollout_s: float,
                     record_tokens: bool = False, adv_spec: AdvantageSpec | None = None
                     ) -> tuple[StepSamples, float]:
    """(the step's training samples: the kept groups, with the records of ALL groups, each
    marked `kept`; the step's filter rate). `order`: the step's prompt ids in pool order."""
    groups = {p: [rewards[(p, j)] for j in range(samples_per_prompt)] for p in order}
    kept, dropped = select_groups(order, groups, num_groups)
    kept_set = set(kept)

    def keys(prompts: Sequence[int]) -> set[tuple[int, int]]:
        return {(p, j) for p in prompts for j in range(samples_per_prompt)}

    got = assemble_step(step, version, keys(kept),
                        [c for c in completions if c.spec.prompt in kept_set], dict(rewards),
                        rollout_s, record_tokens, None, adv_spec)
    rest = assemble_step(step, version, keys(dropped),
                         [c for c in completions if c.spec.prompt not in kept_set],
                         dict(rewards), rollout_s, record_tokens, None,
                         adv_spec) if dropped else None
    kept_records = got.records

    def build() -> list[dict[str, Any]]:  # lazily, like `Records` (the twin without --out)
        records = [dict(r, kept=True) for r in kept_records]
        records += [dict(r, kept=False) for r in (rest.records if rest else ())]
        return sorted(records, key=lambda r: (r["prompt"], r["sample"]))

    got.records = Records(build, len(completions))
    return got, filter_rate(groups)
