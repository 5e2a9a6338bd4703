"""How deep pipelined rollouts go at staleness s, and in which order their runs end (pure).

At staleness s step t needs version t - s, which training publishes once it has every sample
of step t - s - 1. So when step t's run starts, steps t - s .. t - 1 may still be finishing
their tails: at most `max_tails(s)` earlier runs beside the newest one. The samples held
between a run and the training step that consumes them are bounded accordingly
(`buffered_samples_bound`): the steps whose rollouts may run at once, plus the one training
is consuming.

Runs may finish in any order (a later step's run can empty before an earlier tail's last
request), but their ends are processed in step order (`Endings`): samples.jsonl, the step
board and the controller's rollout-end moves see step t - 1 before step t, exactly as in the
plain loop. Only the devices a finished run frees go to the newest run at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def max_tails(staleness: int) -> int:
    """How many earlier steps' runs may still be finishing while the newest one starts."""
    if staleness < 0:
        raise ValueError(f"staleness = {staleness}: allowed 0 or more")
    return staleness


def max_rolling_steps(staleness: int) -> int:
    """How many steps may roll out at once: the newest plus its tails."""
    return max_tails(staleness) + 1


DEEP_SHARE_FACTOR = 2
"""Staleness >= 2: how many times its share of the remaining requests an engine of a new
pipelined run may hold until the run hands off (`share_factor`)."""


def share_factor(staleness: int) -> int:
    """How many times its share, ceil(remaining / rollout engines), one engine of a pipelined
    run may hold until the run hands off (`RunSettings.share_factor`; the cap keeps an early
    engine from ending the step with a long FIFO tail while the engines still to come get
    the rest, `rollout.deal`). 1 at staleness 1. Deeper (s >= 2) `DEEP_SHARE_FACTOR`: a new
    run then often starts on one or two engines while the earlier steps' tails hold the
    others for tens of seconds, and training needs its samples only s steps later, so its
    first engines take more (hysteresis, das, s = 2, 8 steps: dapo-7b 32 GPUs 30.70 -> 31.93
    samples/s, agentic 32 17.58 -> 18.12; without a cap agentic fell to 11.64, a quarter of
    its engines holding the whole step; docs/results.md, depth-gap). The loop moves on from a
    run only once its engines hold the rest at this cap (`EnginePool.gathered`,
    `RolloutRun.share_cap`)."""
    return 1 if staleness < 2 else DEEP_SHARE_FACTOR


def buffered_samples_bound(staleness: int, samples_per_step: int) -> int:
    """Most samples produced and not yet consumed by training at any time: every step whose
    rollout may run at once (`max_rolling_steps`) holds at most one step's samples; training
    consumes step t - s - 1's before step t may start. At staleness 0 only one step exists
    at a time."""
    if samples_per_step < 0:
        raise ValueError(f"samples_per_step = {samples_per_step}: allowed 0 or more")
    return max_rolling_steps(staleness) * samples_per_step


class Endings(Generic[T]):
    """The ends of the runs the loop moved on from (oldest first), at most `max_tails(s)`.

    The loop adds each step's end (`add`) and, before it keeps one more, takes the oldest
    ones beyond the bound to wait for (`over_bound`). Each end waits for the one added before
    it (`previous`) before it posts anything, so ends are processed in step order."""

    def __init__(self, staleness: int) -> None:
        self.bound = max_tails(staleness)
        self._ends: deque[T] = deque()

    def __len__(self) -> int:
        return len(self._ends)

    def __iter__(self) -> Iterator[T]:
        return iter(self._ends)

    def previous(self) -> T | None:
        """The end the next one added must wait for (the newest kept), or None."""
        return self._ends[-1] if self._ends else None

    def add(self, end: T) -> None:
        if len(self._ends) >= self.bound:
            raise RuntimeError(f"{len(self._ends)} runs end in the background already: "
                               f"at most {self.bound} at staleness {self.bound}")
        self._ends.append(end)

    def over_bound(self, keeping: int = 1) -> list[T]:
        """Remove and return the oldest ends the loop must wait for so that `keeping` more
        fit within the bound (all of them when the bound is 0)."""
        out: list[T] = []
        while self._ends and len(self._ends) + keeping > self.bound:
            out.append(self._ends.popleft())
        return out

    def take_all(self) -> list[T]:
        """Remove and return every end (oldest first): before a blocking resize, at the end."""
        out = list(self._ends)
        self._ends.clear()
        return out
