"""Controllers: decide, from what the run measures, when to move which devices (design §3).

The orchestrator asks its controller at three points of every step and applies the moves it
returns (each a resize at the next optimizer-step boundary):

- `at_step_start(view)`: before the step's rollout (inter-step split);
- `on_rollout_progress(view)`: after completions arrive (intra-step: the thinning tail);
- `at_rollout_end(view)`: once the step's last request finished and the moves fired during
  its rollout were applied (it decides on the allocation they left).

Controllers are pure decision logic over a `RunView` snapshot: no devices, no clocks, no I/O,
so the same controller runs live and in the simulator. `ScheduleController` applies the
config's forced `[[resize.schedule]]`; it is also the `static` policy (an empty schedule).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from dynaresize.config import Config, ResizeEntry, schedule_order
from dynaresize.core.allocation import Allocation


@dataclass(frozen=True)
class Move:
    move: str
    """'rollout->train' or 'train->rollout'."""
    num_devices: int
    blocking: bool = False
    """At step start: True delays the step's rollout until the resize is done (forced
    schedules); False lets the rollout start and the devices join when the boundary comes."""
    idle_first: bool = False
    """rollout->train: take the rollout devices with no request left first (nothing to
    migrate), as found when the resize runs; then the usual highest-index ones."""


@dataclass(frozen=True)
class StepTiming:
    step: int
    rollout_s: float
    train_s: float
    tokens: int
    num_rollout_devices: int
    num_train_devices: int
    train_device_s: float = 0.0
    """Device-seconds the step's training computed (streaming: its micro-batches and the
    optimizer step, without the waits for groups); 0: train_s x num_train_devices."""

    rollout_device_s: float = 0.0
    """Device-seconds the step's rollout held engines (each engine from its first to its
    last slice of the step); 0: not measured."""
    rollout_tail_device_s: float = 0.0
    """Of `rollout_device_s`, those after the remaining requests first fit on the engines at
    `controller.hysteresis.tail_batch` each: engines waiting for their last requests (about the same
    time per engine, whatever the width)."""

    ready_profile: tuple[float, ...] = ()
    """Streaming: the share of the step's training tokens whose micro-batches were ready
    (every group complete) by each tenth of its rollout (`StepStream.ready_profile`);
    empty: not measured."""
    response_cv: float | None = None
    """Coefficient of variation (std / mean) of the step's response lengths: 0 for equal
    lengths, ~0.15 for short, even ones, ~1 and more for a long tail (DAPO-like, bimodal);
    None: not measured."""
    num_micro_batches: int = 0
    """The micro-batches the step trained, each on one trainer (with few per trainer, more
    trainers need not train faster: `StageModel.train_s`); 0: not measured."""

    @property
    def train_work_s(self) -> float:
        return self.train_device_s or self.train_s * self.num_train_devices


@dataclass
class RunView:
    """What a controller may look at. Read-only: `history` and `resize_critical_s` are the
    orchestrator's own lists (not copied, since a view is built on every completion)."""

    step: int
    now_s: float
    allocation: Allocation
    staleness: int
    rollout_total: int = 0
    rollout_finished: int = 0
    rollout_started_s: float = 0.0
    history: list[StepTiming] = field(default_factory=list)
    resize_critical_s: list[float] = field(default_factory=list)
    """Measured critical-path time of each completed resize, in order."""
    resize_wall_s: list[float] = field(default_factory=list)
    """Measured wall time of each completed resize (the optimizer-step boundary is held
    that long: what a training step waiting for it loses), in order."""
    num_pending_resizes: int = 0
    """Resizes decided but still waiting for an optimizer-step boundary."""
    train_busy: bool = False
    """A training step (or a resize) holds the optimizer-step boundary right now."""
    pipelined: bool = False
    """Step k + 1's rollout starts on the engines step k's tail empties
    (`orchestrator_rollout`): the rollout costs its device-seconds, its tail overlaps."""
    rollout_idle: int = 0
    """Rollout devices of the running step with no request left once its queue is empty
    (they have nothing more to do in this step); 0 while requests are queued."""
    train_todo: float = 0.0
    """Streaming: the share of the oldest untrained step's training tokens in micro-batches
    no training device holds yet (its remaining training work; micro-batches not ready yet
    count the mean of the ready ones, `StepStream.todo_fraction`); 0 without streaming."""


class Controller(Protocol):
    """Decides moves. `needs_progress`: False lets the orchestrator skip
    `on_rollout_progress` calls that cannot return anything; `streams_training`: ask for
    training that streams over completed groups (`dynaresize.core.stream`). A class that
    derives from `Controller` inherits their defaults."""

    needs_progress: bool = True
    streams_training: bool = False

    def at_step_start(self, view: RunView) -> list[Move]: ...

    def on_rollout_progress(self, view: RunView) -> list[Move]: ...

    def at_rollout_end(self, view: RunView) -> list[Move]: ...


class ScheduleController(Controller):
    """Forced resizes from `[[resize.schedule]]`; with none, the `static` policy."""

    def __init__(self, entries: list[ResizeEntry]) -> None:
        self._pending = list(entries)

    @classmethod
    def build(cls, cfg: Config) -> ScheduleController:
        """`controller.policy = "static"` (with any forced `[[resize.schedule]]`)."""
        return cls(schedule_order(cfg))

    def _take(self, step: int, fraction: float | None) -> list[Move]:
        due = [e for e in self._pending if e.step < step or (
            e.step == step and (fraction is None or e.fraction <= fraction))]
        self._pending = [e for e in self._pending if e not in due]
        return [Move(e.move, e.num_devices, blocking=e.at == "start") for e in due]

    @property
    def needs_progress(self) -> bool:
        """Whether `on_rollout_progress` can return anything (the orchestrator skips it)."""
        return any(e.at != "start" for e in self._pending)

    def at_step_start(self, view: RunView) -> list[Move]:
        return self._take(view.step, 0.0)

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        if not view.rollout_total:
            return []
        return self._take(view.step, view.rollout_finished / view.rollout_total)

    def at_rollout_end(self, view: RunView) -> list[Move]:
        return self._take(view.step, None)
