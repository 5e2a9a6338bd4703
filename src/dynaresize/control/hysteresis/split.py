"""Choosing the split from measurements (a part of `HysteresisController`, see
`dynaresize.control.hysteresis.controller`).

Each step's duration (step start to step start) is filed under the split it was planned at
and, at staleness 0, the lending mode it ran in (`measure_step`). One split change may reach a
trust region around the current split (neither stage more than doubles or halves) or any split
measured in the last `MEASURED_FOR_STEPS` steps (`candidates`); a candidate scores its
measured step time where it ran, else the model's prediction scaled by how far the model missed
the current split's measurement, and no better than a split measured on the way there
(`scores`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dynaresize.control.base import Move, RunView
from dynaresize.control.hysteresis.model import StageModel, ema

MEASURED_FOR_STEPS = 10
"""A split's measured step time guides the split choice for this many steps."""

TRUST_FACTOR = 2
"""One split change grows or shrinks either stage by at most this factor."""


class SplitChoice:
    """The measured step times per split and the scores a split choice ranks candidates by,
    over the model's predictions (`model`, whose `lend_ok` is the lending mode)."""

    def __init__(self, model: StageModel) -> None:
        self.model = model
        self.p = model.p
        self._step_start_s: dict[int, float] = {}
        self._mode_of_step: dict[int, bool] = {}
        """Staleness 0: whether each step ran in lending mode (its split chosen for lending)."""
        self._split_of_step: dict[int, int] = {}
        """The split (rollout devices) each step was planned at."""
        self._split_step_s: dict[tuple[bool, int], tuple[float, int]] = {}
        """Measured step time (EMA) per (lending mode, split), and the last step it was
        measured in (a split the model favours but that measured slower is not chosen again
        on the model's word); measurements older than `MEASURED_FOR_STEPS` are forgotten (the
        workload may have drifted)."""
        self._mode_step_s: dict[bool, float] = {}
        """Staleness 0: measured step time (EMA) with and without lending at rollout end."""

    def plan(self, step: int, split: int, lend: bool) -> None:
        """File `step` as planned at `split` rollout devices, in lending mode `lend`."""
        self._mode_of_step[step] = lend
        self._split_of_step[step] = split

    def measured(self, lend: bool, split: int) -> tuple[float, int] | None:
        """(measured step time, last step measured) of `split` in mode `lend`, if any."""
        return self._split_step_s.get((lend, split))

    def mode_step_s(self, lend: bool) -> float | None:
        """Staleness 0: the measured step time (EMA) with or without lending, if any."""
        return self._mode_step_s.get(lend)

    def measure_step(self, view: RunView) -> None:
        """The previous step's duration (step start to step start), filed under the split it
        was planned at (`_split_step_s`, from its second step on) and, at staleness 0, under
        the mode it ran in (its split was chosen for lending or not; whether the lend at
        rollout end then fired too is the mode's business: a lending-mode split whose lend
        never pays must count against lending)."""
        prev = self._step_start_s.get(view.step - 1)
        self._step_start_s[view.step] = view.now_s
        if prev is None:
            return
        lent = self._mode_of_step.get(view.step - 1, False)
        split = self._split_of_step.get(view.step - 1)
        # steps 0..s fill the pipeline (at staleness 0, step 0 also pays the first
        # communicators and weight loads)
        if split is not None and view.step - 1 > view.staleness:
            key = (lent, split)
            old = self._split_step_s.get(key)
            fresh = old if old is not None and view.step - old[1] <= MEASURED_FOR_STEPS else None
            self._split_step_s[key] = (ema(fresh[0] if fresh else None, view.now_s - prev,
                                           self.p.ema), view.step)
        if view.staleness != 0:
            return
        self._mode_step_s[lent] = ema(self._mode_step_s.get(lent), view.now_s - prev,
                                      self.p.ema)

    # ------------------------------------------------------------------ decisions
    def trust_region(self, n: int, base: int) -> tuple[int, int]:
        """The splits one change may reach from `base`: neither stage more than doubles or
        halves."""
        t, f = n - base, TRUST_FACTOR
        return (max(1, math.ceil(base / f), n - f * t),
                min(n - 1, f * base, n - math.ceil(t / f)))

    def candidates(self, n: int, base: int, step: int) -> list[int]:
        """Splits worth scoring: a trust region around the current one (neither stage more
        than doubles or halves in one move: the model is fitted where the run is, and far
        from it its shape is a guess) and every split measured recently."""
        lo, hi = self.trust_region(n, base)
        measured = {k for (m, k), got in self._split_step_s.items()
                    if m == self.model.lend_ok and step - got[1] <= MEASURED_FOR_STEPS}
        return sorted(set(range(lo, hi + 1)) | measured)

    def scores(self, n: int, base: int, staleness: int,
                      step: int) -> Callable[[int], float]:
        """Step time per split, for choosing one: measured (this lending mode) where the
        split has run, else the model's prediction scaled by how far the model missed the
        current split's measurement (trust its shape, not its level), and no better than a
        split measured on the way there from the current one (a direction that measured
        slower is not explored further on the model's word)."""
        mode = self.model.lend_ok
        got_base = self._split_step_s.get((mode, base))
        measured_base = got_base[0] if got_base else None
        base_pred = self.model.predict_step_s(base, n, staleness)
        scale = measured_base / base_pred if measured_base and base_pred > 0 else 1.0

        measured = {k: v for (m, k), (v, s) in self._split_step_s.items()
                    if m == mode and step - s <= MEASURED_FOR_STEPS}

        def score(k: int) -> float:
            got = measured.get(k)
            if got is not None:
                return got
            lo, hi = min(base, k), max(base, k)
            on_the_way = [v for j, v in measured.items() if j != base and lo <= j <= hi]
            return max([scale * self.model.predict_step_s(k, n, staleness), *on_the_way])
        return score

    def moves_to(self, num_rollout: int, target: int, blocking: bool = False) -> list[Move]:
        if target > num_rollout:
            return [Move("train->rollout", target - num_rollout, blocking)]
        if target < num_rollout:
            return [Move("rollout->train", num_rollout - target, blocking)]
        return []
