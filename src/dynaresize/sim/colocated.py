"""The `colocated` baseline: every device rolls out, then every device trains (time-sharing,
as a hybrid engine does), run by the same orchestrator loops and cost model as the rest.

Per step `k` on `N` SimDevices under a `VirtualClock` (staleness is 0 by construction: the
rollout of step k needs the weights of step k - 1's update, and nothing overlaps), with every
device in both pools (`SharedPools`) and the role switches of `ColocatedSwitch`:

1. switch to rollout (k > 0), every device at once: offloading its 1/N of the training state
   to host memory (`train_state_bytes(N) / offload_bytes_per_s`), `alloc_kv_s +
   start_serving_s`; then the rollout loop's engines load version k (`weight_sync_s`);
2. rollout: the unchanged rollout loop and `RolloutRun` over all `N` engines;
3. switch to training, every device at once: `release_kv_s` + `release_weights_s` + loading
   the training state back from host memory (same bytes);
4. training: the unchanged train loop, `SimDevice.train_step` on all N ranks (micro-batches
   dealt by `plan_step`), then `publish_weights`.

Step 0 starts with the engines ready (as a disaggregated run's does). The run writes the same
records as any orchestrator run (the switches as `resize.to_train` / `resize.to_rollout`
events, critical; summary.json's `num_resizes` counts the switches).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynaresize.config import Config, to_toml
from dynaresize.control.base import ScheduleController
from dynaresize.core.rundir import RunDir
from dynaresize.core.types import Role
from dynaresize.orchestrator import Orchestrator
from dynaresize.protocols import Clock
from dynaresize.sim.clock import VirtualClock
from dynaresize.sim.costs import CostModel
from dynaresize.sim.device import make_devices
from dynaresize.sim.harness import SimPromptSource, SimRun, no_gc


def switch_parts_s(costs: CostModel, num_devices: int, to_train: bool) -> float:
    """Seconds one role switch takes besides loading weights (module docstring, 1 and 3)."""
    r = costs.resize
    offload_s = costs.train_state_bytes(num_devices) / r.offload_bytes_per_s
    if to_train:
        return r.release_kv_s + r.release_weights_s + offload_s
    return offload_s + r.alloc_kv_s + r.start_serving_s


def switch_s(costs: CostModel, num_devices: int, to_train: bool) -> float:
    """Seconds one role switch takes, weights included (to rollout: `weight_sync_s`)."""
    return switch_parts_s(costs, num_devices, to_train) + (
        0.0 if to_train else costs.weight_sync_s())


class SharedPools:
    """Every device in both pools (what the loops read of an `Allocation`)."""

    def __init__(self, num_devices: int) -> None:
        self.rollout = self.train = tuple(range(num_devices))
        self.roles = (Role.ROLLOUT,) * num_devices

    def describe(self) -> str:
        return f"{len(self.rollout)} colocated"


class ColocatedSwitch:
    """The role switches of a colocated run (a `RoleSwitch`): every device at once."""

    def __init__(self, costs: CostModel, num_devices: int, clock: Clock,
                 rundir: RunDir) -> None:
        self.num_devices = num_devices
        self.clock = clock
        self.rundir = rundir
        self.to_rollout_s = switch_parts_s(costs, num_devices, to_train=False)
        self.to_train_s = switch_parts_s(costs, num_devices, to_train=True)
        self.num_switches = 0

    async def _switch(self, seconds: float, kind: str) -> None:
        t0 = self.clock.now()
        await self.clock.sleep(seconds)
        t1 = self.clock.now()
        for d in range(self.num_devices):
            self.rundir.event(t0, t1, d, kind, critical=True)
        self.num_switches += 1

    async def to_rollout(self, step: int) -> None:
        if step > 0:  # step 0 starts with the engines ready
            await self._switch(self.to_rollout_s, "resize.to_rollout")

    async def to_train(self, step: int) -> None:
        await self._switch(self.to_train_s, "resize.to_train")


def run_colocated(cfg: Config, workload: Any, costs: CostModel,
                  out_dir: str | Path | None = None) -> SimRun:
    """Run the colocated baseline for `cfg.run.steps` steps on `cfg.num_devices` devices
    (the allocation in `cfg` is ignored: every device does both); records as `run_config`."""
    clock = VirtualClock()
    n = cfg.num_devices
    devices = make_devices(n, n, costs, workload, clock)
    rundir = RunDir(out_dir)
    rundir.write_config(to_toml(cfg))
    switch = ColocatedSwitch(costs, n, clock, rundir)
    try:
        orch = Orchestrator(cfg, devices, clock, SimPromptSource(workload), rundir,
                            controller=ScheduleController([]), allocation=SharedPools(n),
                            switch=switch)
        with no_gc():
            summary = clock.run(orch.run())
        summary["num_resizes"] = switch.num_switches
        rundir.summary(summary)
    finally:
        rundir.close()
    return SimRun(summary, rundir, orch)
