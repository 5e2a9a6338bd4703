"""The best fixed split, searched: pure planning over a `score(num_rollout)` callable.

`simulate`'s `static` and `reference` rows run at the split this search returns; their
honesty (issue 19) is only as good as the search. The simulated mean step time as a function
of the number of rollout devices R falls while the rollout binds, rises once training binds,
and is flat-ish and noisy in between (tail-bound steps); the closed-form estimate
(`run.analytic_step_s`) is often flat over a wide range there (the longest request alone
binds), so its optimum is a poor place to stop. The search:

1. **Grid**: scores every `num_devices // 8`-th split (7 or 8 points, or every split on
   fewer than 16 devices) and the caller's `start` (the analytic optimum).
2. **Pattern search**: from the grid's best, at spacing half the grid's, steps to the better
   neighbour (R - h or R + h) as long as it improves, in either direction and as far as it
   keeps improving (the best may leave the grid's bracket); when neither neighbour improves,
   halves h, down to `finest` (max(1, N // 128): beyond 128 devices a few devices change the
   step time by well under 1%).

Ties go to the fewer rollout devices, so the result is a function of the scores only
(deterministic). Every split is scored at most once, at most `max_probes` in all: where the
next step would score more, the search stops at the best so far. `probe_steps` picks the
steps a score simulates and `estimated_mean_step_s` what it measures.

Cheaper, same answer: with a `lower_bound(r)` (a value no score at r can be below), a split
whose bound exceeds the best score found so far is never scored: it could not be the best,
nor a neighbour the pattern search steps to, so the result is the one without bounds. It
counts against `max_probes` as if scored (the stopping rule is unchanged). The grid is scored
in order of the bound (`start` first), so a good best is known early; with `score_many`
(several splits at once, e.g. in parallel processes) it is scored `batch` at a time, and the
pattern search scores both neighbours at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

GRID_DIVISIONS = 8
"""The grid scores every `num_devices // GRID_DIVISIONS`-th split."""
MAX_PROBES = 40
"""At most this many splits are scored (a bound on the search's cost)."""


def probe_steps(num_steps: int, staleness: int) -> list[int]:
    """The steps of a run of `num_steps` a candidate split simulates: 3 + `staleness`
    (enough that the pipeline's fill, the first `staleness` steps, does not dominate),
    spread evenly over the run (so drifting lengths are seen), all of them in a shorter run."""
    count = min(num_steps, 3 + staleness)
    return sorted({int(k) for k in np.linspace(0, num_steps - 1, count)})


def estimated_mean_step_s(step_s: list[float], staleness: int, num_steps: int) -> float:
    """A probe's score: the mean step time of the whole run of `num_steps` it stands for. Its
    first `staleness` steps (at staleness 1 the first step also waits for the first rollout:
    the pipeline's fill, paid once a run) count once each, the mean of the others for every
    other step of the run; a probe of the whole run scores its own mean."""
    fill = min(staleness, len(step_s) - 1)
    rest = step_s[fill:]
    return (sum(step_s[:fill]) + (num_steps - fill) * float(np.mean(rest))) / num_steps


def search_best_split(score: Callable[[int], float], num_devices: int,
                      start: int | None = None, finest: int | None = None,
                      max_probes: int = MAX_PROBES,
                      lower_bound: Callable[[int], float] | None = None,
                      score_many: Callable[[list[int]], list[float]] | None = None,
                      batch: int = 1) -> tuple[int, int]:
    """The number of rollout devices in 1..`num_devices` - 1 of least `score` found by the
    grid and pattern search of the module docstring. Returns (it, number of splits scored).
    `lower_bound`, `score_many` and `batch`: the module docstring (same result)."""
    if num_devices < 2:
        raise ValueError(f"num_devices = {num_devices}: must be >= 2 (one per stage)")
    hi = num_devices - 1
    finest = max(1, num_devices // 128) if finest is None else max(1, finest)
    known = _Known(score, score_many, lower_bound)
    grid = max(1, num_devices // GRID_DIVISIONS)
    candidates = set(range(grid, hi + 1, grid))
    if start is not None and 1 <= start <= hi:
        candidates.add(start)
    order = sorted(candidates, key=lambda r: (r != start, known.bound(r), r))
    for i in range(0, len(order), max(1, batch)):
        known.score_unless_pruned(order[i:i + max(1, batch)])
    best = min(order, key=known.key)
    spacing = max(finest, grid // 2)
    while True:
        around = [r for r in (best - spacing, best + spacing) if 1 <= r <= hi]
        if len(known.values) + sum(r not in known.values for r in around) > max_probes:
            break
        known.score_unless_pruned(around)
        step = min(around, key=known.key) if around else best
        if known.key(step)[0] < known.key(best)[0]:  # strictly better: no plateau walks
            best = step
        elif spacing > finest:
            spacing = max(finest, spacing // 2)
        else:
            break
    return best, known.num_scored


class _Known:
    """The scores found so far, and the splits pruned by their lower bound (their value is
    the bound: above the best score, so never the minimum nor a step of the search)."""

    def __init__(self, score: Callable[[int], float],
                 score_many: Callable[[list[int]], list[float]] | None,
                 lower_bound: Callable[[int], float] | None) -> None:
        self._score, self._score_many, self._lower_bound = score, score_many, lower_bound
        self.values: dict[int, float] = {}
        self.num_scored = 0

    def bound(self, r: int) -> float:
        return self._lower_bound(r) if self._lower_bound is not None else 0.0

    def key(self, r: int) -> tuple[float, int]:
        if r not in self.values:
            self.score_unless_pruned([r])
        return self.values[r], r

    def score_unless_pruned(self, splits: list[int]) -> None:
        """Score those of `splits` not known yet whose bound is not above the best score."""
        best = min(self.values.values(), default=math.inf)
        todo = []
        for r in splits:
            if r in self.values or r in todo:
                continue
            bound = self.bound(r)
            if bound > best:
                self.values[r] = bound
            else:
                todo.append(r)
        if not todo:
            return
        scores = (self._score_many(todo) if self._score_many is not None and len(todo) > 1
                  else [self._score(r) for r in todo])
        self.values.update(zip(todo, scores))
        self.num_scored += len(todo)
