"""What the rollout loop and the train loop share (`LoopParts`), built once by the
orchestrator: run state, the step board, the resizer, recovery, the clock, the run directory
and the role switch. Each loop gets its own settings besides (`RolloutSettings`,
`TrainSettings`) and the collaborators only it uses."""

from __future__ import annotations

from dataclasses import dataclass

from dynaresize.core.rundir import RunDir
from dynaresize.orchestrator.board import StepBoard
from dynaresize.orchestrator.recovery import NullRecovery, Recovery
from dynaresize.orchestrator.resizer import Resizer
from dynaresize.orchestrator.state import RunState
from dynaresize.orchestrator.switch import RoleSwitch
from dynaresize.protocols import Clock


@dataclass(frozen=True)
class LoopParts:
    state: RunState
    board: StepBoard
    resizer: Resizer
    recovery: Recovery | NullRecovery
    clock: Clock
    rundir: RunDir
    switch: RoleSwitch


@dataclass(frozen=True)
class TrainSettings:
    """What the train loop reads of the config."""

    steps: int
    streaming: bool
    """Training streams over completed groups (`dynaresize.core.stream`)."""
