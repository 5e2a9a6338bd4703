"""How a pipelined rollout run gives its engines to the next step (a mixin of `RolloutRun`).

Once the next step's run exists, `hand_off` lets each engine that has nothing left of this
step leave for it (the last one stays until this run ends, so requeued work always has an
engine), and packs the thinning tail: as soon as the other engines would hold every remaining
request at `pack_batch` each, the least-loaded engine exports its requests (token prefix and
sampler state, so they continue unchanged elsewhere, design §2.3), they are requeued in front
on the others, and the engine leaves too. One engine is packed at a time.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from dynaresize.protocols import Device

if TYPE_CHECKING:
    from dynaresize.rollout.scheduler import Work, _Slot


class HandOff:
    """Mixin: needs `RolloutRun`'s slots, queue, counters, `requeue`, `_device_failed`."""

    _slots: dict[int, _Slot]
    queue: deque[Work]
    remaining: int
    error: BaseException | None
    finished: asyncio.Event
    expected_devices: Callable[[], int] | None
    _on_idle: Callable[[Device], None] | None
    pack_batch: int
    num_migrated: int
    _packing: asyncio.Task[None] | None

    def requeue(self, device: Device, exported: list[Work]) -> None:
        raise NotImplementedError

    def _device_failed(self, slot: _Slot, exc: BaseException) -> None:
        raise NotImplementedError

    def hand_off(self, on_idle: Callable[[Device], None]) -> None:
        """From now on a device with nothing left to run here (the queue is empty and it
        holds no request) leaves this run for `on_idle(device)` (the next step's rollout),
        except the last one, which stays until the run ends (requeued work always has a
        device). The devices idle now leave at once. Devices no longer join, so no share cap
        applies (`expected_devices`), and packing starts (`pack_batch`)."""
        self._on_idle = on_idle
        self.expected_devices = None
        for slot in sorted(self._slots.values(), key=lambda s: s.device.index, reverse=True):
            if slot.load == 0 and not slot.pending:
                self._maybe_release(slot)
        self._maybe_pack()

    def _maybe_pack(self) -> None:
        """Start moving the least-loaded engine's requests to the others if the rest hold
        every remaining request at `pack_batch` each (one engine at a time)."""
        if (not self.pack_batch or self._on_idle is None or self.queue or self.error
                or self._packing is not None or self.finished.is_set()
                or (len(self._slots) - 1) * self.pack_batch < self.remaining):
            return
        active = [s for s in self._slots.values() if not s.leaving]
        if len(active) < 2 or (len(active) - 1) * self.pack_batch < self.remaining:
            return
        slot = min(active, key=lambda s: (s.load, -s.device.index))
        # leaving from now, not once `_evacuate` starts: until then another engine that
        # empties must not count this one as staying and leave too (the run would keep
        # requests and no engine)
        slot.leaving = True
        slot.wake.set()
        self._packing = asyncio.ensure_future(self._evacuate(slot))

    async def _evacuate(self, slot: _Slot) -> None:
        """Packing: `slot`'s engine finishes its slice, exports its requests (tokens and
        sampler state: they continue unchanged elsewhere, design §2.3), which are requeued in
        front, and is handed off."""
        device = slot.device
        try:  # `slot` is already leaving (`_maybe_pack`)
            assert slot.task is not None
            await slot.task
            if self.error is not None or self._slots.get(device.index) is not slot:
                return  # the run failed, or the device was lost meanwhile (`_lose` took it)
            try:
                exported = await device.export_inflight()
            except Exception as exc:
                self._device_failed(slot, exc)
                return
            self.num_migrated += len(exported)
            self.requeue(device, exported)
            assert self._on_idle is not None
            self._on_idle(device)
        finally:
            self._packing = None
        self._maybe_pack()

    def _maybe_release(self, slot: _Slot) -> bool:
        """Hand `slot`'s device to `_on_idle` if it may go (see `hand_off`)."""
        if self._on_idle is None or slot.leaving or self.queue or (
                self.remaining and not any(s is not slot and not s.leaving
                                           for s in self._slots.values())):
            return False
        slot.leaving = True
        self._slots.pop(slot.device.index, None)
        slot.wake.set()
        self._on_idle(slot.device)
        return True
