"""The engine pool: which rollout engines serve which step, and with which version.

It owns the newest step's run (`run`) and, with pipelined rollouts, the earlier steps'
tails (`tails`, oldest first: at most `pipeline.max_tails(s)`), and moves engines from them
to the newest run. Which version each engine serves is `EngineVersions`'; the engines in
transit (on their way to the newest run, loading a new step's version, borrowed, leaving by
a resize, serving early) are `EngineTransit`'s. The rollout loop drives it
(`start_run`, `keep_tail`, `end_run`); recovery takes a dead engine out of every run
(`drop_lost`). Devices a resize moves and the resize executor's hooks are `ResizeHooks`'
(`orchestrator/engine_hooks.py`), a tail's rescue when it lost its last engine is
`EngineRescue`'s (`orchestrator/engine_rescue.py`); both act on the pool through its public
methods.

Invariant: an engine joins a run only once it serves that run's version, and every rollout
device not in transit is in the newest run or held by a tail.
"""

from __future__ import annotations

import asyncio

from dynaresize.orchestrator.background import Background
from dynaresize.orchestrator.engine_transit import EngineTransit
from dynaresize.orchestrator.engine_versions import EngineVersions
from dynaresize.orchestrator.state import RunState
from dynaresize.protocols import Clock, Device, WeightHandle
from dynaresize.rollout.run import RolloutRun


class EnginePool:
    def __init__(self, state: RunState, clock: Clock, background: Background,
                 versions: EngineVersions, transit: EngineTransit) -> None:
        self.state = state
        self.clock = clock
        self.background = background
        self.versions = versions
        """Which version each engine serves; loads weights (`load_version`)."""
        self.transit = transit
        """The engines in transit (`EngineTransit`)."""
        self.run: RolloutRun | None = None
        """The newest step's rollout (what controllers see and resizes act on)."""
        self.tails: list[RolloutRun] = []
        """Earlier steps' rollouts whose tails still run, oldest first (pipelined only)."""
        self._settled = asyncio.Event()
        self._settled.set()
        self._moved = asyncio.Event()
        """Set whenever an engine arrived in a run or a tail ended (`gathered` re-checks)."""

    # ------------------------------------------------------------------ the pool
    def rollout_devices(self) -> list[Device]:
        """The rollout pool, plus devices that serve ahead of their resize's commit, minus
        devices on their way to training (stopped, not yet committed)."""
        transit = self.transit
        indices = sorted((set(self.state.allocation.rollout) | transit.serving_early)
                         - transit.leaving)
        return [self.state.devices[i] for i in indices]

    def num_rollout_devices(self) -> int:
        """len(self.rollout_devices()) in O(1): devices serving early are training devices,
        devices leaving are rollout devices."""
        transit = self.transit
        return (len(self.state.allocation.rollout) + len(transit.serving_early)
                - len(transit.leaving))

    @property
    def tail_run(self) -> RolloutRun | None:
        """The newest tail (the previous step's run while it finishes), or None."""
        return self.tails[-1] if self.tails else None

    def is_tail(self, run: RolloutRun | None) -> bool:
        return any(tail is run for tail in self.tails)

    async def settle(self) -> None:
        """Return once a single step rolls out (no tail, no engine in transit)."""
        while self.tails or self.transit.has_arriving():
            self._settled.clear()
            await self._settled.wait()

    def tail_busy(self) -> set[int]:
        """Rollout devices a tail still holds, an engine leaving it (packed away, exporting)
        included, or that are on their way to the newest run (pipelined; empty otherwise)."""
        busy = self.transit.in_transit()
        for tail in self.tails:
            busy.update(tail.held_devices())
        return busy

    def engaged(self) -> set[int]:
        """Rollout devices some run holds (leaving ones included) or on their way to one,
        a new step's engines loading its version (`load_free`) included."""
        busy = self.tail_busy() | self.transit.loading
        if self.run is not None:
            busy.update(self.run.held_devices())
        return busy

    def serves_rollout(self, index: int) -> bool:
        """Whether device `index` is in the rollout pool now (`rollout_devices`)."""
        transit = self.transit
        return index not in transit.leaving and (
            index in self.state.allocation.rollout or index in transit.serving_early)

    async def load_free(self, version: int, handle: WeightHandle) -> list[Device]:
        """A new step's first engines: the free rollout devices (in no run, on their way to
        none) load `version`. Returns those still free and serving it after the load: while
        the weights loaded a resize may have taken one to training (and committed), or a
        death kept one from loading."""
        busy = self.engaged()
        ready = [d for d in self.rollout_devices() if d.index not in busy]
        with self.transit.loading_for_step({d.index for d in ready}):
            await self.load_version(version, handle, ready)
        busy = self.engaged()
        return [d for d in ready if d.index not in busy and self.serves_rollout(d.index)
                and self.versions.of(d.index) == version]

    def arriving(self) -> set[int]:
        """Devices on their way to the newest run: they left the previous tail or were free
        and load its version (`run_settings.Arrivals`; read it only)."""
        return self.transit.arriving()

    def check_settled(self) -> None:
        """An engine arrived in a run, or a tail ended, or a rescue did: `gathered` and
        `settle` look again."""
        self._moved.set()
        if not self.tails and not self.transit.has_arriving():
            self._settled.set()

    async def gathered(self, run: RolloutRun) -> None:
        """Return once `run`'s queue is empty (`drained`) or it holds every engine it can get
        before a tail ends: every rollout device is in it or held by a tail, none in transit,
        and its engines hold every remaining request at no more than its share cap each
        (`RolloutRun.share_cap`: `share_factor` times the share over the whole rollout
        pool, at most `max_running`; once it hands off, only they serve its queue).
        At staleness >= 2 the loop may then move on (`pipeline`): a tail's last engine stays
        until its run ends, so waiting for `drained` would keep the pipeline one tail deep;
        the run hands off once the next step starts and its engines take the rest.
        Why the cap and not `max_running`: engines the tails free after the hand-off go to
        later steps, so a run that moved on with a few engines kept its whole step on them,
        up to `max_running` each, though training needs it first (measured:
        docs/results.md, "Where the time went")."""
        while not run.drained.is_set() and not self._has_all_it_can(run):
            self._moved.clear()
            waits = [asyncio.ensure_future(self._moved.wait()),
                     asyncio.ensure_future(run.drained.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()

    def _has_all_it_can(self, run: RolloutRun) -> bool:
        # its own engines alone serve its queue once it hands off: they must hold it all,
        # each no more than the share cap it had while waiting for engines (`gathered`)
        cap = run.share_cap(self.num_rollout_devices())
        if self.transit.has_arriving() or run.progress.remaining > len(run.devices()) * cap:
            return False
        held = set(run.held_devices()) | self.tail_busy()
        return all(d.index in held for d in self.rollout_devices())

    # ------------------------------------------------------------------ runs (rollout loop)
    def start_run(self, run: RolloutRun) -> None:
        """`run` is the newest step's (its engines are added by the rollout loop)."""
        self.run = run

    def hand_off_tail(self) -> None:
        """Every tail's engines join the newest run as they empty (the older tails handed
        off when their successor started; `join_newest` reads the newest run then)."""
        for tail in self.tails:
            tail.hand_off(self.join_newest)

    def keep_tail(self, run: RolloutRun) -> None:
        """The loop moves on while `run`'s tail finishes (pipelined; the newest tail last)."""
        self.tails.append(run)

    def end_run(self, run: RolloutRun) -> None:
        """`run` finished (tails may finish in any order): its last engines go to the newest
        step."""
        if self.is_tail(run):
            for index in run.devices():
                self.join_newest(self.state.devices[index])
            self.tails = [tail for tail in self.tails if tail is not run]
            self.check_settled()
        if self.run is run:
            self.run = None

    def adopt_free_engines(self, run: RolloutRun) -> None:
        """Rollout devices in no run and not on their way to one join `run` (after loading its
        version): those freed while its weights loaded, e.g. the previous step's last tail
        engines when that run ended just before this one existed, or a device a resize
        brought while no step rolled out."""
        busy = self.tail_busy() | set(run.devices())
        for device in self.rollout_devices():
            if device.index not in busy:
                self.join_newest(device)

    def join_newest(self, device: Device) -> None:
        """`RolloutRun.hand_off`'s callback: `device` left the previous step's tail."""
        self.transit.add_arriving(device.index)
        self.background.spawn(self._move_to_newest(device))

    def _destination(self) -> RolloutRun | None:
        """Where an engine leaving a tail goes: the oldest tail whose queue never emptied
        (staleness >= 2: the loop moved on from it, `gathered`), else the newest run."""
        for tail in self.tails:
            if not tail.drained.is_set():
                return tail
        return self.run

    async def _move_to_newest(self, device: Device) -> None:
        """Load the newest step's version on `device` and add it to that step's run (if
        that run ended meanwhile, the device waits, free, for the next one; if a resize took
        it out meanwhile, it stays out, even if that resize was rolled back or committed)."""
        try:
            while True:
                run = self._destination()
                if run is None or run.finished.is_set() or not self.serves_rollout(device.index):
                    return
                if self.versions.of(device.index) != run.version:
                    await self.load_version(run.version, self.state.versions.get(run.version),
                                            [device])
                if self._destination() is run and not run.finished.is_set() \
                        and self.serves_rollout(device.index):
                    run.add_devices([device])
                    return
        finally:
            self.transit.arrived(device.index)
            self.check_settled()

    def drop_lost(self, device: Device, exc: BaseException) -> None:
        """A dead rollout device (fenced by recovery) leaves every run still holding it; its
        requests rerun on the others (a resize may have stopped it and met its death in
        `export_inflight`, before handing its requests back)."""
        for run in (self.run, *self.tails):
            if run is not None:
                run.drop_lost(device, exc)

    async def load_version(self, version: int, handle: WeightHandle,
                           engines: list[Device]) -> None:
        """Load `version` on the engines of `engines` that do not serve it yet."""
        await self.versions.load(version, handle, engines)
