"""What controllers decide from: a `RunView` built from the components' state (read-only)."""

from __future__ import annotations

from dynaresize.control.base import RunView
from dynaresize.orchestrator.board import StepBoard
from dynaresize.orchestrator.boundary import OptimizerBoundary
from dynaresize.orchestrator.engine_pool import EnginePool
from dynaresize.orchestrator.resizer import Resizer
from dynaresize.orchestrator.state import RunState
from dynaresize.protocols import Clock


class RunViews:
    def __init__(self, state: RunState, engines: EnginePool, resizer: Resizer,
                 boundary: OptimizerBoundary, board: StepBoard, clock: Clock, staleness: int,
                 pipelined: bool, idle_matters: bool) -> None:
        self.state = state
        self.engines = engines
        self.resizer = resizer
        self.boundary = boundary
        self.board = board
        self.clock = clock
        self.staleness = staleness
        self.pipelined = pipelined
        self.idle_matters = idle_matters
        """`RunView.rollout_idle` is read at staleness 0 with streaming only (O(devices))."""

    def __call__(self) -> RunView:
        """The view now (its lists are the components' own: read-only)."""
        run, state, resizer = self.engines.run, self.state, self.resizer
        return RunView(step=state.step, now_s=self.clock.now(), allocation=state.allocation,
                       staleness=self.staleness,
                       rollout_total=run.progress.total if run else 0,
                       rollout_finished=run.progress.num_finished if run else 0,
                       rollout_started_s=state.rollout_started_s,
                       history=state.history, resize_critical_s=resizer.critical_s,
                       resize_wall_s=resizer.wall_s,
                       num_pending_resizes=resizer.num_pending,
                       train_busy=self.boundary.busy(),
                       train_todo=self.board.train_todo(), pipelined=self.pipelined,
                       rollout_idle=len(run.idle_devices()) if run and self.idle_matters
                       else 0)
