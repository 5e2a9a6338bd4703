"""How far one `RolloutRun` is and what it measured: `RunProgress`.

It counts the run's requests (`total`, `remaining`, `num_finished`; `num_rerun`: restarted
after their device died; `num_migrated`: moved to another engine), keeps what finished
(`completions`) and batches it for the run's `on_completions` callback (`to_report`: at least
`PROGRESS_FRACTION` of the requests in flight, all once none is left). It measures each
engine's busy span in the step (`busy_s`), each request's life (`lives`, the step's
`tail_tokens_per_s`) and when the run's tail began (`light_s`, `tail_device_s`). Changed only
through its methods, by the run that owns it; read by the step that assembles the run's
samples, the engine pool and the run's view.
"""

from __future__ import annotations

from collections.abc import Sequence

from dynaresize.core.types import Completion
from dynaresize.protocols import Clock
from dynaresize.rollout.lives import RequestLives
from dynaresize.rollout.run_settings import PROGRESS_FRACTION
from dynaresize.rollout.slots import Work, work_key


class RunProgress:
    """One run's request counts, completions and measurements (module docstring)."""

    def __init__(self, clock: Clock, total: int) -> None:
        self.clock = clock
        self.total = total
        self.remaining = total
        self.num_rerun = 0
        """Requests restarted from scratch because their device died."""
        self.num_migrated = 0
        """Requests moved to another engine by packing or spreading."""
        self.completions: list[Completion] = []
        self._unreported: list[Completion] = []
        """Finished, not yet handed to `on_completions` (PROGRESS_FRACTION)."""
        self.busy_s: dict[int, list[float]] = {}
        """device → [first slice start, last slice end] in this step."""
        self.lives = RequestLives()
        """Each request's first submission and life (the step's `tail_tokens_per_s`)."""
        self.light_s: float | None = None
        """When the remaining requests first fit on the run's engines at `light_batch` each:
        from then on engines wait for their last requests (`tail_device_s`)."""

    @property
    def num_finished(self) -> int:
        return self.total - self.remaining

    def add(self, num_requests: int) -> None:
        """`num_requests` more requests joined the run."""
        self.total, self.remaining = self.total + num_requests, self.remaining + num_requests

    def rerun(self, num_requests: int) -> None:
        """`num_requests` requests of a lost device restart from scratch."""
        self.num_rerun += num_requests

    def migrated(self, num_requests: int) -> None:
        """`num_requests` requests were exported from one engine to go on another."""
        self.num_migrated += num_requests

    def busy_span(self, index: int, start_s: float) -> list[float]:
        """Engine `index`'s [first slice start, last slice end], opened at `start_s` if new;
        the caller sets its end after each slice."""
        return self.busy_s.setdefault(index, [start_s, start_s])

    def submitted(self, work: Sequence[Work], now_s: float) -> None:
        """`work` went to an engine at `now_s` (a request moved or rerun keeps its first)."""
        self.lives.submitted(map(work_key, work), now_s)

    def completed(self, completions: Sequence[Completion], now_s: float,
                  light_total: int) -> None:
        """`completions` came back at `now_s`; the tail begins once at most `light_total`
        requests remain (the run's engines x `light_batch`)."""
        for c in completions:
            self.lives.finished(c.spec.key, c.num_tokens, now_s)
        self.remaining -= len(completions)
        self.completions.extend(completions)
        if self.light_s is None and self.remaining <= light_total:
            self.light_s = now_s

    def to_report(self, completions: Sequence[Completion], num_queued: int
                  ) -> list[Completion] | None:
        """`completions` plus those held back, if they make a batch to hand to
        `on_completions` (at least PROGRESS_FRACTION of the requests in flight, or none left);
        else None (held back). `num_queued`: requests not yet dispatched."""
        batch = self._unreported
        batch.extend(completions)
        in_flight = self.remaining - num_queued + len(batch)
        if self.remaining and len(batch) < PROGRESS_FRACTION * in_flight:
            return None
        self._unreported = []
        return batch

    def tail_device_s(self) -> float:
        """Device-seconds engines were held in the run's tail (after `light_s`)."""
        start = self.light_s if self.light_s is not None else self.clock.now()
        return sum(max(0.0, b - max(a, start)) for a, b in self.busy_s.values())
