"""ResizeHooks: rollout devices leaving and joining the rollout. The resize executor calls
its hooks (`stop_admission`, `requeue`, `current_weights`, `start_serving`), the resizer picks
the devices a resize may take where they are (`movable_to_train`, `mark_leaving`) and ends a
resize (`forget_moved`), recovery makes rollout devices in no run serve again after a repair
(`serve_idle`). It owns which run each stopped device came from and the version the devices
joining the rollout loaded; which devices leave or serve early is `EngineTransit`'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from dynaresize.orchestrator.engine_transit import EngineTransit
from dynaresize.orchestrator.engine_versions import EngineVersions
from dynaresize.orchestrator.state import RunState
from dynaresize.protocols import Device, WeightHandle
from dynaresize.rollout.run import RolloutRun


class HookedPool(Protocol):
    """What the resize hooks need of the engine pool (`EnginePool`)."""

    @property
    def run(self) -> RolloutRun | None: ...

    @property
    def tails(self) -> Sequence[RolloutRun]: ...

    def rollout_devices(self) -> list[Device]: ...

    def tail_busy(self) -> set[int]: ...

    def engaged(self) -> set[int]: ...

    def serves_rollout(self, index: int) -> bool: ...

    def is_tail(self, run: RolloutRun | None) -> bool: ...

    def join_newest(self, device: Device) -> None: ...


class TailRescue(Protocol):
    """`EngineRescue`: a tail that a resize left with requests and no engine gets one."""

    def rescue_tail(self, tail: RolloutRun, version: int, lost_index: int) -> None: ...


class ResizeHooks:
    def __init__(self, pool: HookedPool, transit: EngineTransit, state: RunState,
                 versions: EngineVersions, rescue: TailRescue) -> None:
        self.pool = pool
        self.transit = transit
        self.state = state
        self.versions = versions
        """Which version each engine serves (`start_serving` sets the loaded one)."""
        self.rescue = rescue
        self._loading: dict[int, int] = {}
        """Device joining the rollout -> the version `current_weights` named for it (what it
        loads: several devices of one resize may load different versions, a new step's run
        having started in between)."""
        self._stopped_in: dict[int, RolloutRun] = {}
        """Devices a resize stopped -> the run that held them (their requests go back there)."""

    def movable_to_train(self, num: int) -> tuple[int, ...] | None:
        """Staleness >= 2 (`Resizer.deep`): `num` rollout devices a resize may stop where they
        are, without waiting for one step to roll out, or None if there are fewer: those in
        no run and not in transit, then the newest run's engines with nothing left (its
        queue empty), then its others (highest index first), then each tail's likewise
        (newest first). Every run keeps one engine that is not taken, and none of its others
        leaves counting on a taken one (`mark_leaving`), so the requests a stopped device
        hands back to its run (`requeue`) always have an engine."""
        pool = self.pool
        run = pool.run
        taken = pool.tail_busy() | (set(run.held_devices()) if run is not None else set())
        picks = [d.index for d in pool.rollout_devices() if d.index not in taken]
        runs = ([run] if run is not None else []) + [t for t in pool.tails[::-1] if t is not run]
        for one in runs:  # the newest run is the newest tail too until the next one starts
            active = set(one.devices()) - self.transit.leaving
            idle = [i for i in one.idle_devices() if i in active]
            working = sorted(active - set(idle), reverse=True)
            picks += idle + working[:-1] if working else idle[:-1]
        return tuple(picks[:num]) if len(picks) >= num else None

    def mark_leaving(self, indices: tuple[int, ...]) -> None:
        """The devices a resize takes (`movable_to_train`) stop taking work now, before
        its `stop_admission` runs: no other engine of their runs leaves counting on them."""
        for index in indices:
            if (holder := self._holder(index)) is not None:
                holder.mark_leaving(self.state.devices[index])

    def _holder(self, index: int) -> RolloutRun | None:
        for run in (self.pool.run, *self.pool.tails):
            if run is not None and index in run.held_devices():
                return run
        return None

    async def stop_admission(self, device: Device) -> None:
        self.transit.leave(device.index)
        holder = self._holder(device.index)
        if holder is not None:
            self._stopped_in[device.index] = holder
            await holder.stop_admission(device)

    def requeue(self, device: Device, exported: list[Any]) -> None:
        """A stopped device's requests go back to the run that held it (if it still runs;
        else, with nothing exported, to the newest). A tail left with requests and no engine
        (a resize that settled took its last one while the loop pipelined again) is rescued
        as if that engine had died (`rescue_tail`)."""
        pool = self.pool
        run = self._stopped_in.pop(device.index, None)
        if run is None or not (run is pool.run or pool.is_tail(run)):
            run = pool.run
        if run is None:
            assert not exported, "requests in flight outside a rollout step"
            return
        run.requeue(device, exported)
        if pool.is_tail(run) and run.progress.remaining and not run.devices():
            self.rescue.rescue_tail(run, run.version, device.index)

    def start_serving(self, device: Device) -> None:
        """A device the resize loaded with `current_weights` joins the running rollout. If the
        rollout loop moved on to a step that needs another version meanwhile (pipelined
        rollouts: the next step's run may start while a resize loads weights), the device
        first loads that version (`join_newest`), as an engine leaving a tail does."""
        self.transit.serve(device.index, early=device.index not in self.state.allocation.rollout)
        self._serve(device, self._loading.pop(device.index))

    def _serve(self, device: Device, version: int) -> None:
        """`device`, loaded with `version`, joins the newest run (first loading its version
        if that is another)."""
        self.versions.set_loaded(device.index, version)
        run = self.pool.run
        if run is None:
            return
        if version == run.version:
            run.add_devices([device])
        else:
            self.pool.join_newest(device)

    def current_weights(self, for_devices: Sequence[int]) -> tuple[int, WeightHandle]:
        """The version devices `for_devices`, joining the rollout, load (`start_serving` joins
        each with it): the running step's; between runs the step the rollout loop is at, or,
        if training ran ahead and the store dropped that one meanwhile, the newest (the next
        step's run loads its own on stale engines)."""
        run, versions = self.pool.run, self.state.versions
        if run is not None:  # every run the loop holds carries its version
            version = run.version
        else:
            version = min(self.state.rollout_version, versions.latest)
            if not versions.has(version):
                version = versions.latest
        for index in for_devices:
            self._loading[index] = version
        return version, versions.get(version)

    def engine_gone(self, index: int) -> None:
        """Device `index` holds no engine (a trainer reassigned to the rollout pool, or an
        engine released): whichever run it joins loads weights first (`load_weights` builds
        the engine), never submitting to it before."""
        self.versions.gone(index)

    def forget_moved(self, to_rollout: tuple[int, ...], to_train: tuple[int, ...] = ()) -> None:
        """A resize ended (committed or rolled back): its devices are in their pools (a
        rollback stops the devices it had brought to the rollout: those leave `leaving`
        too)."""
        moved = set(to_rollout) | set(to_train)
        self.transit.forget(moved)
        for index in moved:
            self._stopped_in.pop(index, None)

    async def serve_idle(self) -> None:
        """Recovery, at its repair: rollout devices in no run and on their way to none (a
        failed resize lost track of them, a trainer reassigned to the rollout) load the
        running step's version (`current_weights`) and serve it. Each is borrowed meanwhile
        (`EngineTransit.borrowing`, in `tail_busy`), so no other path takes it too; one a
        resize took meanwhile stays out."""
        pool = self.pool
        if pool.run is None:
            return
        for device in pool.rollout_devices():
            if device.index in pool.engaged():
                continue
            with self.transit.borrowing(device.index):
                version, handle = self.current_weights(())
                await device.alloc_kv()
                await device.load_weights(version, handle)
            if pool.serves_rollout(device.index) and device.index not in pool.engaged():
                self._serve(device, version)
