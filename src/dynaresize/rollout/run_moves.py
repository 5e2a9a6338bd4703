"""Moving requests off a live engine, the part of `RolloutRun` (a mixin) that packs a handed-off
tail onto fewer engines and spreads a thin one (`rollout.handoff`, `rollout.tail_order`). Both
go through one routine, `_export_and_requeue`: the engine finishes its slice, exports its
requests (token prefix and sampler state, design §2.3) and they are requeued in front. The
attributes below are `RolloutRun`'s, set by its constructor."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from dynaresize.protocols import RolloutOps
from dynaresize.rollout.handoff import may_release, pack_candidate
from dynaresize.rollout.run_progress import RunProgress
from dynaresize.rollout.run_settings import RunSettings
from dynaresize.rollout.slots import EngineSlot, SlotTable, Work

if TYPE_CHECKING:
    from dynaresize.rollout.tail_order import TailOrder


class RequestMoves:
    """Packing and spreading for `RolloutRun` (see the module docstring)."""

    settings: RunSettings
    tail: TailOrder | None
    queue: deque[Work]
    progress: RunProgress
    error: BaseException | None
    finished: asyncio.Event
    may_spread: Callable[[], bool] | None
    _on_idle: Callable[[RolloutOps], None] | None
    _packing: asyncio.Task[None] | None
    _spreading: asyncio.Task[None] | None
    _slots: SlotTable

    def requeue(self, device: RolloutOps, exported: list[Work]) -> None:  # RolloutRun's
        raise NotImplementedError

    def add_devices(self, devices: list[RolloutOps]) -> None:  # RolloutRun's
        raise NotImplementedError

    def _dispatch(self, joined: bool = False) -> None:  # RolloutRun's
        raise NotImplementedError

    def _device_failed(self, slot: EngineSlot, exc: BaseException) -> None:  # RolloutRun's
        raise NotImplementedError

    def _maybe_release(self, slot: EngineSlot) -> bool:
        """Hand `slot`'s device to `_on_idle` if it may go (`hand_off`)."""
        if self._on_idle is None or not may_release(slot, list(self._slots),
                                                    not self.queue, self.progress.remaining):
            return False
        slot.leave()
        self._slots.pop(slot.index)
        self._on_idle(slot.device)
        return True

    def _movable(self) -> bool:
        return not (self.queue or self.error or self.finished.is_set())

    def _maybe_pack(self) -> None:
        """Handing off: move the least-loaded engine's requests to the others if the rest
        hold every remaining request at `pack_batch` each (one engine at a time)."""
        pack_batch = self.settings.pack_batch
        if not pack_batch or self._on_idle is None or self._packing is not None \
                or not self._movable():
            return
        slot = pack_candidate(list(self._slots), self.progress.remaining, pack_batch)
        if slot is None:
            return
        # leaving from now, not once the export starts: until then another engine that
        # empties must not count this one as staying and leave too (the run would keep
        # requests and no engine)
        slot.leave()
        self._packing = asyncio.ensure_future(self._export_and_requeue(slot, rejoin=False))

    def _maybe_spread(self) -> None:
        """Spread the most loaded engine if the tail is uneven (rollout/tail_order.py)."""
        tail = self.tail
        if (tail is None or not tail.spread or self._spreading is not None
                or not self._movable() or self._on_idle is not None
                or (self.may_spread is not None and not self.may_spread())):
            return
        index = tail.spread_source({s.index: s.load for s in self._slots.active()})
        if index is None:
            return
        slot = self._slots.get(index)
        assert slot is not None
        slot.leave()  # no more work for it until it is back
        self._spreading = asyncio.ensure_future(self._export_and_requeue(slot, rejoin=True))

    async def _export_and_requeue(self, slot: EngineSlot, rejoin: bool) -> None:
        """`slot`'s engine (already leaving) finishes its slice and exports its requests
        (token prefix and sampler state: they continue unchanged elsewhere, design §2.3),
        which are requeued in front. Then it comes back empty (`rejoin`: spreading; the
        requests longest predicted first) or leaves for the next step (packing)."""
        device = slot.device
        try:
            await slot.stopped()
            if self.error is not None or not self._slots.holds(slot):
                return  # the run failed, or the device was lost or moved meanwhile
            try:
                exported = await device.export_inflight()
            except Exception as exc:
                self._device_failed(slot, exc)
                return
            self.progress.migrated(len(exported))
            if not rejoin:
                self.requeue(device, exported)
                assert self._on_idle is not None
                self._on_idle(device)
            else:
                assert self.tail is not None
                work = self.tail.spread_work(exported, slot.pending)
                back = self._slots.holds(slot)
                if back:
                    self._slots.pop(slot.index)
                self.queue.extendleft(reversed(work))
                if back:
                    self.add_devices([device])  # back, empty: dispatch spreads the work
                else:  # taken meanwhile (`requeue`): the work goes back without it
                    self._dispatch()
        finally:
            if rejoin:
                self._spreading = None
            else:
                self._packing = None
        if not rejoin:
            self._maybe_pack()
