"""Run state shared by the orchestrator's components: published versions and the ledger of
allocation, step and optimizer step. Each field names its one writer; every other component
only reads it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from dynaresize.control.base import StepTiming
from dynaresize.core.allocation import Allocation
from dynaresize.core.types import Role
from dynaresize.protocols import Device, WeightHandle


def sample_version(step: int, staleness: int) -> int:
    """The one policy version every sample of `step` comes from at staleness `staleness`
    (design §2): `max(0, step - staleness)`, whatever the allocation, timing or resizes."""
    return max(0, step - staleness)


class VersionStore:
    """Published policy versions: version → weight handle; waiters block until published.
    Keeps the `keep` newest (staleness s needs s + 1: the rollout of step k + s loads version
    k while versions up to k + s may be published)."""

    def __init__(self, keep: int = 2) -> None:
        self._handles: dict[int, WeightHandle] = {0: None}
        self.latest = 0
        self.keep = max(2, keep)
        self._changed = asyncio.Condition()

    async def publish(self, version: int, handle: WeightHandle) -> None:
        async with self._changed:
            self._handles[version] = handle
            self.latest = max(self.latest, version)
            for old in [v for v in self._handles if v <= version - self.keep]:
                del self._handles[old]
            self._changed.notify_all()

    async def wait(self, version: int) -> WeightHandle:
        async with self._changed:
            await self._changed.wait_for(lambda: version in self._handles)
            return self._handles[version]

    def get(self, version: int) -> WeightHandle:
        return self._handles[version]

    def has(self, version: int) -> bool:
        """Whether `version` is still kept (the `keep` newest are)."""
        return version in self._handles


class RunState:
    """Where the run is, changed only through its methods. Callers: the allocation
    (`commit_allocation`, `fence`): the resizer (recovery fences through it); `step`,
    `rollout_version`, `rollout_started_s`, `filter_rates` (`enter_step`, `rollout_needs`,
    `rollout_started`, `step_filtered`): the rollout loop; `optimizer_step`, `history`,
    `train_end_s` (`optimizer_stepped`, `step_trained`): the train loop; `t_start_s`
    (`started`): the orchestrator; `versions` (publish): the train loop (also what a resume
    restored)."""

    def __init__(self, devices: Sequence[Device], allocation: Allocation,
                 start_step: int, staleness: int = 1,
                 filter_rates: Mapping[int, float] | None = None) -> None:
        self.devices = list(devices)
        self.versions = VersionStore(keep=staleness + 1)
        self.allocation = allocation
        self.train_tenure: dict[int, int] = {}
        """Device -> how many times it joined the training pool after the start (a streamed
        step's held gradients stay with the tenure they were accumulated in)."""
        self.start_step = start_step
        """The first step this run executes (the checkpoint's, on resume)."""
        self.step = 0
        """The step the rollout loop is at."""
        self.optimizer_step = start_step
        """Optimizer steps taken (= the version the trainers hold)."""
        self.rollout_version = 0
        """The version the rollout loop's current step needs."""
        self.rollout_started_s = 0.0
        self.t_start_s = 0.0
        self.history: list[StepTiming] = []
        self.train_end_s: list[float] = []
        self.filter_rates: dict[int, float] = dict(filter_rates or {})
        """Dynamic sampling: step -> the fraction of its groups without a reward signal, on
        their exact rewards (plans later steps' up-front prompts; a checkpoint keeps those a
        resume plans from, `core.dynamic_sampling.resumed_filter_rates`)."""

    def started(self, t_s: float) -> None:
        """The devices are up (the orchestrator)."""
        self.t_start_s = t_s

    def enter_step(self, step: int) -> None:
        """The rollout loop is at `step`."""
        self.step = step

    def rollout_needs(self, version: int) -> None:
        """The rollout loop's step samples from `version` (it is published)."""
        self.rollout_version = version

    def rollout_started(self, t_s: float) -> None:
        self.rollout_started_s = t_s

    def step_filtered(self, step: int, rate: float) -> None:
        """Dynamic sampling: `step`'s groups are rewarded, a fraction `rate` without a
        signal (the rollout loop)."""
        self.filter_rates[step] = rate

    def optimizer_stepped(self) -> None:
        """The trainers took one more optimizer step (the train loop)."""
        self.optimizer_step += 1

    def step_trained(self, timing: StepTiming, end_s: float) -> None:
        """A step's training ended at `end_s` (the train loop)."""
        self.train_end_s.append(end_s)
        self.history.append(timing)

    def train_devices(self) -> list[Device]:
        return [self.devices[i] for i in self.allocation.train]

    def commit_allocation(self, allocation: Allocation) -> None:
        """A resize committed (the resizer, at the optimizer-step boundary)."""
        for index in set(allocation.train) - set(self.allocation.train):
            self.train_tenure[index] = self.train_tenure.get(index, 0) + 1
        self.allocation = allocation

    def fence(self, index: int) -> None:
        """Device `index` died: no pool uses it again (recovery)."""
        self.allocation = self.allocation.with_roles({index: Role.IDLE})
