"""Recovery from device deaths: fence the device, re-form the world, restore training, go on.

```
 device call fails ──► is its process gone? ── no ──► the error propagates (a bug, not a fault)
                              │ yes
                              ▼
  fence: role IDLE in the allocation (no pool uses it again); a rollout device's submitted
  requests rerun elsewhere from scratch (RolloutRun; seeded → identical tokens)
                              │  at the next optimizer-step boundary (train lock held)
                              ▼
  rebuild the world among survivors (devices.world): fresh store port, renumbered ranks
                              │
       a training rank died?  ├── no ──► trainers keep their shards (same order, same rows)
                              └── yes ─► RECOVERY POINT: the last DCP checkpoint of this run
                                         (or the version-0 model with fresh AdamW state if
                                         none), then REPLAY the optimizer steps since then on
                                         the steps' retained samples, then retry the step
```

Why this recovery point: a dead rank's shards (parameters and AdamW moments) are gone, so the
state must come from disk or be recomputed. Every step's samples are a function of the config
(design §2), so re-running the optimizer steps after the checkpoint on the same samples gives
the same update (up to reduction order, ~1e-5); no rollout is redone, no sample is regenerated
or dropped, and the versions already published stay valid. Memory: the samples of at most
`run.checkpoint_every` steps (all steps when checkpoints are off). A training step that failed
is never skipped: it reruns on the survivors.

A death that empties a pool (its only device): at the repair a live device of the other pool
moves into it (`reassign`, the resizer's) and the trainers' state is restored; a rollout pool
emptied while the train loop waits for its samples is repaired at once (`repair_soon`).

A death during a resize: the executor rolls back (or its rollback fails on the dead device);
then the same path runs, on the old allocation minus the dead device. Rollout devices that the
failed resize had stopped are brought back to serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from dynaresize.core.rundir import RunDir
from dynaresize.core.samples import StepSamples
from dynaresize.core.types import Role
from dynaresize.orchestrator.engine_pool import EnginePool
from dynaresize.orchestrator.plain_step import PlainStep
from dynaresize.orchestrator.state import RunState
from dynaresize.protocols import Clock, RolloutOps


class IdleServing(Protocol):
    """What recovery needs of the resize hooks (`ResizeHooks`)."""

    async def serve_idle(self) -> None: ...
    """Rollout devices in no run load the running step's version and serve it."""


class DeviceFaults(Protocol):
    """What recovery needs from a backend that can lose devices (the Ray device pool)."""

    def is_alive(self, index: int) -> bool: ...

    def new_store(self) -> int | str: ...
    """A fresh rendezvous for rebuilding the world."""

    def cause(self, index: int) -> str | None: ...
    """Why a dead device died, where the backend knows (e.g. killed as hung), else None."""


class NullRecovery:
    """Recovery off (a backend that cannot lose devices): every device error propagates."""

    enabled = False
    num_repairs = 0
    """Always 0 (the same field as `Recovery.num_repairs`)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        """Always empty (the same field as `Recovery.records`)."""

    def retain(self, step: int, got: StepSamples) -> None:
        return None

    def checkpointed(self, num_steps: int, train_path: str) -> None:
        return None

    def on_rollout_lost(self, device: RolloutOps, exc: BaseException) -> bool:
        return False

    def find_dead(self, how: str) -> bool:
        return False

    async def repair(self) -> bool:
        return False


class Recovery:
    """Driver-side fault handling for one run (see module docstring). `faults.is_alive(index)`
    and `faults.new_store()` come from the backend (process table; a fresh rendezvous);
    `fence(index)` takes a dead device out of every pool (the resizer, the allocation's one
    writer)."""

    enabled = True

    def __init__(self, faults: DeviceFaults, state: RunState, engines: EnginePool,
                 hooks: IdleServing, fence: Callable[[int], None], stepper: PlainStep,
                 clock: Clock, rundir: RunDir, *,
                 reassign: Callable[[int, Role], Awaitable[None]] | None = None,
                 repair_soon: Callable[[], None] | None = None) -> None:
        self.is_alive = faults.is_alive
        self.new_store = faults.new_store
        self.cause = faults.cause
        self.state = state
        self.engines = engines
        self.hooks = hooks
        """Rollout devices in no run serve again after a repair (`ResizeHooks.serve_idle`)."""
        self.fence = fence
        self.reassign = reassign
        """`reassign(index, role)`: move a live device into a pool deaths emptied (the
        resizer's `Resizer.reassign`, the allocation's one writer); None: such a run stops."""
        self.repair_soon = repair_soon
        """Repair at the boundary in the background (`Resizer.repair_soon`): a death that
        empties the rollout pool, as no step can reach the boundary otherwise."""
        self.stepper = stepper
        self.clock = clock
        self.rundir = rundir
        self.lost: list[int] = []
        self.world_stale = False
        self.num_repairs = 0
        """World rebuilds so far: each drops what devices held (e.g. streamed gradients)."""
        self.train_state_lost = False
        self.records: list[dict[str, Any]] = []
        self._retained: dict[int, StepSamples] = {}
        self._train_point: tuple[int, str] | None = None

    # ------------------------------------------------------------------ bookkeeping
    def retain(self, step: int, got: StepSamples) -> None:
        """Keep step `step`'s samples until a checkpoint covers it (replay log)."""
        self._retained[step] = got

    def checkpointed(self, num_steps: int, train_path: str) -> None:
        """A consistent training state after `num_steps` steps is on disk at `train_path`."""
        self._train_point = (num_steps, train_path)
        for step in [s for s in self._retained if s < num_steps]:
            del self._retained[step]

    def _fence(self, index: int, how: str) -> None:
        if index in self.lost:
            return
        state = self.state
        if index in state.allocation.train:
            self.train_state_lost = True
        role = state.allocation.roles[index].value
        self.lost.append(index)
        self.world_stale = True
        self.fence(index)
        now = self.clock.now()
        record: dict[str, Any] = {"device": index, "role": role, "how": how, "t_s": now}
        cause = self.cause(index)
        if cause is not None:
            record["cause"] = cause
        self.records.append(record)
        self.rundir.event(now, now, index, "fault", critical=True, role=role, how=how,
                          **({"cause": cause} if cause is not None else {}))
        self.engines.drop_lost(state.devices[index], RuntimeError(f"device {index} {how}"))
        if not state.allocation.rollout and self.repair_soon is not None:
            self.repair_soon()

    # ------------------------------------------------------------------ detection
    def on_rollout_lost(self, device: RolloutOps, exc: BaseException) -> bool:
        """RolloutRun's hook: True (device gone, its requests rerun) or False (a real error)."""
        if self.is_alive(device.index):
            return False
        if device.index not in self.lost:
            self._fence(device.index, f"{type(exc).__name__} during rollout")
            run = self.engines.run
            self.records[-1]["rerun_requests"] = run.progress.num_rerun if run is not None else 0
        return True

    def find_dead(self, how: str) -> bool:
        """Fence every device whose process is gone; True if any (new or not yet repaired)."""
        for d in self.state.devices:
            if d.index not in self.lost and not self.is_alive(d.index):
                self._fence(d.index, how)
        return self.world_stale

    # ------------------------------------------------------------------ repair
    async def repair(self) -> bool:
        """At an optimizer-step boundary (train lock held): world, trainers, rollout pool.
        A device that dies during the repair (world rebuild, restore, replay, reloading an
        engine) is fenced too and the repair starts over on the new survivors. Returns
        whether it repaired anything (the allocation may have changed)."""
        repaired = False
        for _ in range(len(self.state.devices)):
            if not self.world_stale:
                return repaired
            repaired = True
            num_lost = len(self.lost)
            try:
                await self._repair_once()
            except Exception:  # a device lost during this attempt (fenced here or already)?
                self.find_dead("died during recovery")
                if len(self.lost) == num_lost:
                    raise
        if self.world_stale:
            raise RuntimeError(f"recovery gave up: devices {self.lost} died")
        return repaired

    async def _refill_empty_pool(self) -> None:
        """Deaths emptied a pool (its only device died, e.g. after a resize had left one
        trainer): a live device of the other pool, if it has two or more, moves to it. Either
        way the trainers' state is restored (a new trainer has none, a leaving one takes its
        shards). Both pools need a device: with one survivor the run stops (an error)."""
        allocation = self.state.allocation
        if allocation.train and allocation.rollout:
            return
        empty, other = (Role.TRAIN, allocation.rollout) if not allocation.train \
            else (Role.ROLLOUT, allocation.train)
        if len(other) < 2 or self.reassign is None:
            raise RuntimeError(f"device deaths {self.lost} left {allocation.describe()}; "
                               "each pool needs at least one device")
        busy = self.engines.tail_busy() if empty is Role.TRAIN else set()  # pipelined: a
        index = next((i for i in reversed(other) if i not in busy), other[-1])  # previous
        await self.reassign(index, empty)  # step's tail holds it: rather another one
        self.train_state_lost = True
        now = self.clock.now()
        self.records[-1]["reassigned"] = {"device": index, "to": empty.value}
        self.rundir.event(now, now, index, "reassign", critical=True, role=empty.value,
                          lost=list(self.lost))

    async def _repair_once(self) -> None:
        state = self.state
        await self._refill_empty_pool()
        t0 = self.clock.now()
        survivors = [d for d in state.devices if d.index not in self.lost]
        ranks = {d.index: r for r, d in enumerate(survivors)}
        store = self.new_store()
        restore = self.train_state_lost
        # every survivor's call ends (done, or failed within faults.timeout_s) before a
        # retry: one still waiting in this rendezvous would miss the next one's (found live)
        done = await asyncio.gather(*(d.rebuild_world(store, ranks, state.allocation.train,
                                                      state.optimizer_step, not restore)
                                      for d in survivors), return_exceptions=True)
        for result in done:
            if isinstance(result, BaseException):
                raise result
        num_replayed = await self._restore_train_state() if restore else 0
        await self.hooks.serve_idle()
        t1 = self.clock.now()
        self.world_stale = self.train_state_lost = False
        self.num_repairs += 1
        for d in survivors:
            self.rundir.event(t0, t1, d.index, "recovery", critical=True,
                              lost=list(self.lost), replayed_steps=num_replayed,
                              restored=restore)
        self.records[-1].update(recovery_s=round(t1 - t0, 4), replayed_steps=num_replayed,
                                restored=restore)

    async def _restore_train_state(self) -> int:
        """Recovery point + replay; returns the number of optimizer steps replayed."""
        trainers = self.state.train_devices()
        optimizer_step = self.state.optimizer_step
        start = 0
        if self._train_point is not None:
            start, path = self._train_point
            await asyncio.gather(*(d.load_checkpoint(path, start) for d in trainers))
        missing = [k for k in range(start, optimizer_step) if k not in self._retained]
        if missing:
            raise RuntimeError(f"cannot replay steps {missing}: their samples were not kept")
        for step in range(start, optimizer_step):
            await self.stepper.run(trainers, step, self._retained[step])
        return optimizer_step - start

