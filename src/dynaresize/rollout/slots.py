"""The engines of one `RolloutRun` and which queued request each takes next.

`EngineSlot` is one engine's place in a run (its load, the requests dispatched and not yet
submitted, those submitted and not finished); `SlotTable` holds a run's slots and deals queued
work to them: to the least-loaded slot with room (ties: lowest index), greedily from a heap of
candidates, or, for a long queue, level by level in one pass (`rollout.deal.seats`), which
gives the same assignment. Both are changed only through their methods, by the run that owns
them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import sys
from collections import deque
from collections.abc import Callable, Iterator

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.protocols import RolloutOps
from dynaresize.rollout.deal import seat_positions, seats

Work = RequestSpec | InflightRequest
Take = Callable[[int], Work]
"""`take(engine index)`: the queued work that engine gets next (removed from the queue)."""


def work_key(work: Work) -> tuple[int, int, int]:
    return work.spec.key if isinstance(work, InflightRequest) else work.key


class EngineSlot:
    """One engine in one run."""

    def __init__(self, device: RolloutOps) -> None:
        self.device = device
        self.load = 0
        """Requests dispatched to it and not finished."""
        self.pending: list[Work] = []
        """Dispatched, not yet submitted."""
        self.inflight: dict[tuple[int, int, int], Work] = {}
        """Submitted to the device and not completed: what reruns elsewhere if it dies."""
        self.wake = asyncio.Event()
        self.leaving = False
        self.lost = False
        """Its device died (`lose`): what it returns from now on was already rerun."""
        self.task: asyncio.Task[None] | None = None

    @property
    def index(self) -> int:
        return self.device.index

    def start(self, task: asyncio.Task[None]) -> None:
        self.task = task

    def give(self, work: Work) -> None:
        self.pending.append(work)
        self.load += 1
        self.wake.set()

    def leave(self) -> None:
        """No more work for it; its serving loop ends after the current slice."""
        self.leaving = True
        self.wake.set()

    def to_submit(self) -> list[Work]:
        """The pending work, now in flight."""
        work, self.pending = self.pending, []
        for w in work:
            self.inflight[work_key(w)] = w
        return work

    def finished(self, completions: list[Completion]) -> None:
        for c in completions:
            self.inflight.pop(c.spec.key, None)
        self.load -= len(completions)

    def lose(self) -> list[RequestSpec]:
        """The device died: everything it held, as fresh requests in key order."""
        self.leaving = self.lost = True
        lost = [w.spec if isinstance(w, InflightRequest) else w
                for w in [*self.inflight.values(), *self.pending]]
        self.inflight, self.pending = {}, []
        lost.sort(key=lambda spec: spec.key)
        return lost

    async def stopped(self) -> None:
        """Return once its serving loop ended. Shielded: a caller cancelled meanwhile (a
        resize rolling back because another of its ops failed) must not cancel the serving
        task with its requests."""
        assert self.task is not None
        await asyncio.shield(self.task)


class SlotTable:
    """A run's engine slots and the candidate heap of dispatch (module docstring)."""

    def __init__(self) -> None:
        self._slots: dict[int, EngineSlot] = {}
        self._free: list[tuple[int, int]] = []
        """Heap of (load, device) candidates; stale entries are skipped when popped."""
        self._free_below = sys.maxsize
        """Every serving slot whose load is below this has its (load, index) in `_free` (the
        dispatches that leave a full slot out lower it), so a bulk dispatch under a limit no
        higher reads its candidates from `_free`, not from every slot."""

    def __len__(self) -> int:
        return len(self._slots)

    def __iter__(self) -> Iterator[EngineSlot]:
        return iter(self._slots.values())

    def get(self, index: int) -> EngineSlot | None:
        return self._slots.get(index)

    def num_absent(self, indices: set[int]) -> int:
        """How many of `indices` hold no slot here."""
        return sum(1 for i in indices if i not in self._slots)

    def holds(self, slot: EngineSlot) -> bool:
        return self._slots.get(slot.index) is slot

    def add(self, device: RolloutOps) -> EngineSlot:
        slot = self._slots[device.index] = EngineSlot(device)
        heapq.heappush(self._free, (0, device.index))
        return slot

    def pop(self, index: int) -> EngineSlot | None:
        return self._slots.pop(index, None)

    def clear(self) -> None:
        self._slots.clear()
        self._free = []
        self._free_below = sys.maxsize

    def active(self) -> list[EngineSlot]:
        return [s for s in self._slots.values() if not s.leaving]

    def num_free(self) -> int:
        return len(self._free)

    def freed(self, slot: EngineSlot) -> None:
        """`slot`'s load went down: a candidate again."""
        heapq.heappush(self._free, (slot.load, slot.index))

    def deal_greedy(self, queue: deque[Work], limit: int, take: Take) -> None:
        """One request at a time to the least-loaded slot below `limit`. A limit above a load
        the heap left out as full (a pipelined run's share cap rises when dynamic sampling
        tops it up or the pool shrinks under it) rebuilds the heap from every slot first."""
        if limit > self._free_below:
            self._rebuild(self._candidates(limit), limit)
        while queue and self._free:
            load, index = heapq.heappop(self._free)
            slot = self._slots.get(index)
            if slot is None or slot.leaving or slot.load != load:
                continue  # stale entry
            if load >= limit:  # full: left out of the heap
                self._free_below = min(self._free_below, load)
                continue
            slot.give(take(index))
            if slot.load < limit:
                heapq.heappush(self._free, (slot.load, index))
            else:
                self._free_below = min(self._free_below, slot.load)

    def deal_bulk(self, queue: deque[Work], limit: int, take: Take, num_coming: int = 0
                  ) -> None:
        """`deal_greedy`'s assignment in O(dispatched + slots log slots): the greedy fills
        slots in (load, index) order, i.e. level by level from the lowest load, each level in
        index order (`rollout.deal.seats`); `num_coming` engines on their way hold seats whose
        requests stay queued for them. Rebuilds the candidate heap."""
        slots, loads = self._slots, self._candidates(limit)
        kept: list[Work] = []
        for index in seats(loads, num_coming, limit, len(queue)):
            if index is None:  # a seat to come: the request waits for it, in queue order
                kept.append(queue.popleft())
                continue
            slots[index].give(take(index))
        queue.extendleft(reversed(kept))
        self._rebuild(loads, limit)

    def deal_joined(self, queue: deque[Work], limit: int, num_coming: int) -> None:
        """`deal_bulk` of a FIFO `queue` with `num_coming` seats to come: the same
        assignment, the requests left for the seats to come kept in queue order, moved as list
        slices (one pass at C speed) instead of a pop and a push per kept request."""
        slots, loads = self._slots, self._candidates(limit)
        taken = seat_positions(loads, num_coming, limit, len(queue))
        if taken:
            items = list(queue)
            kept, prev = [], 0
            for pos, index in taken:
                kept.append(items[prev:pos])
                slots[index].give(items[pos])
                prev = pos + 1
            kept.append(items[prev:])
            queue.clear()
            queue.extend(itertools.chain.from_iterable(kept))
        self._rebuild(loads, limit)

    def _candidates(self, limit: int) -> dict[int, int]:
        """index -> load of every serving slot below `limit`: from the heap when it holds them
        all (O(heap), not O(slots))."""
        if limit <= self._free_below:
            slots, loads = self._slots, {}
            for load, index in self._free:
                slot = slots.get(index)
                if slot is not None and not slot.leaving and slot.load == load < limit:
                    loads[index] = load
            return loads
        return {index: slot.load for index, slot in self._slots.items()
                if not slot.leaving and slot.load < limit}

    def _rebuild(self, loads: dict[int, int], limit: int) -> None:
        """The candidate heap after a bulk deal over the candidates `loads`."""
        slots = self._slots
        self._free = [(slots[index].load, index) for index in loads
                      if slots[index].load < limit]
        heapq.heapify(self._free)
        self._free_below = limit
