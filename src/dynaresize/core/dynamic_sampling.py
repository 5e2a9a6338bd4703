"""DAPO dynamic sampling, planned purely (no asyncio, no devices, no clock).

A group whose rewards are all equal has zero advantage everywhere: it costs rollout and
training and teaches nothing. With `train.dynamic_sampling.enabled`, a step keeps B =
`task.prompts_per_step` groups WITH a reward signal (non-zero variance) out of a larger,
seeded draw, and the rest are recorded as dropped. Everything here is a function of the seed
and the rewards only, never of timing, so the records contract (design §2) holds under any
allocation and resize schedule:

- the step's prompt POOL is `source.batch(step, B x max_rounds, seed)` (always the same size,
  so pools of different steps never share prompts); round r is its r-th slice of B prompts,
  in pool order (the seeded order);
- how many rounds a step draws up front (`rounds_for`) follows the filter rate of an earlier
  step whose records are final before this step's rollout starts (`rate_step`: step k - 1 -
  staleness), with a safety margin, capped at `max_rounds`: the extra rounds are dispatched
  with the first, in one rollout, while the first ones run;
- which groups enter the batch (`select_groups`): the first B groups with a signal in pool
  order; if the drawn rounds hold fewer, the first groups without one fill the batch (their
  advantages are 0: no policy-gradient term, only KL/entropy), so the batch always has B
  groups (micro-batching needs a fixed size);
- `certain_shortfall` says when a further round would be needed for sure (more groups
  without signal than the rounds can spare): the rule for a top-up round dispatched during
  the rollout (planned here; the live loop draws its rounds up front).
"""

from __future__ import annotations

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
    """Draw enough rounds for (1 + margin) x B expected groups with a signal."""

    def __post_init__(self) -> None:
        if self.groups_per_step <= 0 or self.max_rounds <= 0 or self.margin < 0:
            raise ValueError(f"bad dynamic sampling plan {self}")

    @property
    def pool_size(self) -> int:
        """Prompts the step's pool draws (`source.batch(step, pool_size, seed)`)."""
        return self.groups_per_step * self.max_rounds

    def rounds_for(self, filter_rate: float | None) -> int:
        """Rounds to draw up front when a fraction `filter_rate` of groups is expected to have
        no signal (None: not known yet, 1 round)."""
        if filter_rate is None:
            return 1
        if filter_rate >= 1.0:
            return self.max_rounds
        need = (1.0 + self.margin) / (1.0 - filter_rate)
        return max(1, min(self.max_rounds, math.ceil(need - 1e-9)))

    def round_prompts(self, pool: Sequence[int], rounds: int) -> list[int]:
        """The prompt ids of the first `rounds` rounds of a step's `pool` (pool order)."""
        if len(pool) != self.pool_size:
            raise ValueError(f"a pool of {len(pool)} prompts, expected {self.pool_size}")
        if not 1 <= rounds <= self.max_rounds:
            raise ValueError(f"rounds = {rounds}: must be in [1, {self.max_rounds}]")
        return list(pool[:rounds * self.groups_per_step])


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


class KeepTracker:
    """Streaming training with dynamic sampling: which groups are KNOWN to be kept as groups
    complete in any order. A complete group with a signal is kept for sure once fewer than
    `num_groups` groups before it in pool order can have a signal (the finished ones with a
    signal plus the unfinished ones); groups without a signal are known only when every
    group is complete (they may fill the batch). The groups released over a step are
    exactly `select_groups`' kept ones, whatever the completion order."""

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
        if len(self.signal) == len(self.order):
            keep = kept_of(self.signal, self.order, self.num_groups)
            out = [p for p in self.order if p in keep and p not in self.released]
        else:
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


def certain_shortfall(num_groups: int, finished_without_signal: int, wanted: int) -> bool:
    """True once the drawn `num_groups` cannot hold `wanted` groups with a signal whatever
    the unfinished ones give: a top-up round is needed (a function of rewards, not of when
    they arrive: the answer at the end of the rollout is the same)."""
    return finished_without_signal > num_groups - wanted


def step_prompts(plan: DynamicSampling, pool: Sequence[Any], step: int, staleness: int,
                 rates: Mapping[int, float]) -> list[Any]:
    """The prompts step `step` rolls out: the first rounds of its `pool` (the source's
    `batch(step, plan.pool_size, seed)`), as many as the filter rate of `rate_step` asks
    (`rates`: step -> filter rate of the steps that ended; missing: 1 round)."""
    earlier = rate_step(step, staleness)
    rounds = plan.rounds_for(rates.get(earlier) if earlier is not None else None)
    if len(pool) != plan.pool_size:
        raise ValueError(f"a pool of {len(pool)} prompts, expected {plan.pool_size}")
    return list(pool[:rounds * plan.groups_per_step])


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
