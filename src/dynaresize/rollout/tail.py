"""TailPolicy: a run's dispatch order by predicted length, and spreading of its thin tail.

`rollout.tail_policy` (docs/tail.md). A step ends with its longest request, and that request
decodes slower the more requests share its engine. So (without knowing any length; the
`LengthPredictor` learns them from completions):

- **Order.** The queue starts with the first sample of every group, then the other samples
  group after group: every group has a request running early, and its completions reveal the
  group's length. Whenever enough new completions arrived, the queued requests are re-sorted,
  the groups predicted longest first (their remaining samples start early, instead of last
  when FIFO reaches them), still group after group (streaming training trains a group once
  all its samples are done); requeued (migrated) work stays in front.
- **Placement** (`take`): an engine whose predicted work (the predicted lengths of the
  requests dispatched to it) is at most the engines' mean gets the longest queued request,
  one above it the shortest, so long requests do not pile up on the engines that happened to
  free slots first.
- **Spread** (`spread`): once the queue is empty and an engine has nothing to run while
  another holds at least `spread_min_load` requests, the most loaded engine finishes its slice,
  exports its requests (token prefix and sampler state: they continue unchanged elsewhere,
  design §2.3) and takes work again; its requests are requeued in front, longest predicted
  first, and dispatch deals them to the emptiest engines. One engine at a time; not while the
  run hands its engines to the next step (then `pack_batch` packs the tail instead) nor while
  `may_spread()` says no (a resize pending). The orchestrator enables it for non-pipelined
  runs only: a pipelined run's engine that is away exporting would look free to the next
  step (`EnginePool.adopt_free_engines`).

Which engine runs a request, and when, never changes its tokens: only time changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.rollout.lengths import LengthPredictor

if TYPE_CHECKING:
    from dynaresize.rollout.scheduler import RolloutRun, Work, _Slot

RESORT_FRACTION = 0.005
"""The queue is re-sorted after this share of the run's requests completed since the last
sort (at least one completion): ~200 sorts a step, O(queue log queue) each."""


def probe_order(requests: Sequence[Work]) -> list[Work]:
    """The first queued sample of every group first, then the others in their order (group
    after group: groups keep completing one after another for streaming training)."""
    seen: set[int] = set()
    probes: list[Work] = []
    rest: list[Work] = []
    for w in requests:
        prompt = _spec(w).prompt
        (rest if prompt in seen else probes).append(w)
        seen.add(prompt)
    return probes + rest


def _spec(work: Work) -> RequestSpec:
    return work.spec if isinstance(work, InflightRequest) else work


def longest_first(queue: Iterable[Work], estimate: Callable[[int], float]) -> list[Work]:
    """Migrated (in-flight) work first in its order, then requests by their group's predicted
    length, longest first, group after group (ties: prompt, then sample)."""
    items = list(queue)
    front = [w for w in items if isinstance(w, InflightRequest)]
    fresh = [w for w in items if not isinstance(w, InflightRequest)]
    est = {p: -estimate(p) for p in {w.prompt for w in fresh}}  # type: ignore[union-attr]
    fresh.sort(key=lambda w: (est[w.prompt], w.prompt, w.sample))  # type: ignore[union-attr]
    return front + fresh


def spread_source(loads: dict[int, int], min_load: int) -> int | None:
    """The engine to spread: the most loaded (ties: highest index) if it holds at least
    `min_load` requests and another engine holds none; else None."""
    if len(loads) < 2 or min(loads.values()) > 0:
        return None
    index = max(loads, key=lambda i: (loads[i], i))
    return index if loads[index] >= max(2, min_load) else None


class TailPolicy:
    """One run's `rollout.tail_policy` (module docstring). Owned by the `RolloutRun`."""

    def __init__(self, run: RolloutRun, spread: bool, spread_min_load: int = 2,
                 may_spread: Callable[[], bool] | None = None,
                 predictor: LengthPredictor | None = None) -> None:
        self.run = run
        self.spread = spread
        self.spread_min_load = spread_min_load
        self.may_spread = may_spread
        self.predictor = predictor if predictor is not None else LengthPredictor()
        self.num_spread = 0
        """Requests spreading moved to another engine."""
        self._since_sort = 0
        self._resort_every = max(1, int(RESORT_FRACTION * run.total))
        self._spreading: asyncio.Task[None] | None = None
        self._work: dict[int, float] = {}
        """engine -> predicted tokens of the requests dispatched to it (at dispatch)."""
        self._total_work = 0.0
        self._placed: dict[tuple[int, int, int], tuple[int, float]] = {}
        run.queue.extend(probe_order([run.queue.popleft() for _ in range(len(run.queue))]))
        if spread:  # engines return at every completion, so a spread never waits long
            run.drain = None

    def _estimate(self, prompt: int) -> float:
        return self.predictor.estimate(prompt, self.run.clock.now())

    # ------------------------------------------------------------------ run hooks
    def before_dispatch(self) -> None:
        """Re-sort the queue if enough completions arrived since the last sort."""
        run = self.run
        if self._since_sort < self._resort_every or len(run.queue) < 2:
            return
        self._since_sort = 0
        ordered = longest_first(run.queue, self._estimate)
        run.queue.clear()
        run.queue.extend(ordered)

    def take(self, index: int) -> Work:
        """The queued work engine `index` gets next: migrated work first; else the longest
        predicted if the engine's predicted work is at most the engines' mean, the shortest
        if above (the queue is sorted longest first), so long requests spread evenly."""
        queue, work = self.run.queue, self._work
        head = queue[0]
        if isinstance(head, InflightRequest):
            w = queue.popleft()
        else:
            mine = work.get(index, 0.0)
            w = queue.popleft() if mine * len(work) <= self._total_work or not work \
                else queue.pop()
        spec = _spec(w)
        self._unplace(spec.key)  # requeued (migrated, or its engine died): placed anew
        tokens = self._estimate(spec.prompt)
        self._placed[spec.key] = (index, tokens)
        work[index] = work.get(index, 0.0) + tokens
        self._total_work += tokens
        return w

    def _unplace(self, key: tuple[int, int, int]) -> None:
        placed = self._placed.pop(key, None)
        if placed is not None:
            index, tokens = placed
            self._work[index] -= tokens
            self._total_work -= tokens

    def submitted(self, work: Sequence[Work]) -> None:
        now_s, predictor = self.run.clock.now(), self.predictor
        for w in work:
            spec = _spec(w)
            predictor.dispatched((spec.prompt, spec.sample), now_s)

    def completed(self, completions: Sequence[Completion]) -> None:
        now_s, predictor = self.run.clock.now(), self.predictor
        for c in completions:
            self._unplace(c.spec.key)
            predictor.finished((c.spec.prompt, c.spec.sample), c.num_tokens, now_s)
        self._since_sort += len(completions)

    async def wait(self) -> None:
        """Return once no spread is in flight (the run's end, `RolloutRun.wait`)."""
        if self._spreading is not None:
            await asyncio.gather(self._spreading, return_exceptions=True)

    # ------------------------------------------------------------------ spreading
    def maybe_spread(self) -> None:
        """Spread the most loaded engine if the tail is uneven (module docstring)."""
        run = self.run
        if (not self.spread or self._spreading is not None or run.queue or run.error
                or run.finished.is_set() or run._on_idle is not None
                or (self.may_spread is not None and not self.may_spread())):
            return
        loads = {i: s.load for i, s in run._slots.items() if not s.leaving}
        index = spread_source(loads, self.spread_min_load)
        if index is None:
            return
        slot = run._slots[index]
        slot.leaving = True  # no more work for it until it is back (`_spread`)
        slot.wake.set()
        self._spreading = asyncio.ensure_future(self._spread(slot))

    async def _spread(self, slot: _Slot) -> None:
        """`slot`'s engine finishes its slice, exports its requests, which are requeued in
        front (longest predicted first), and comes back with an empty slot."""
        run, device = self.run, slot.device
        try:
            assert slot.task is not None
            await slot.task
            if run.error is not None or run._slots.get(device.index) is not slot:
                return  # the run failed, or the device was lost or moved meanwhile
            try:
                exported = await device.export_inflight()
            except Exception as exc:
                run._device_failed(slot, exc)
                return
            for w in exported:
                self._unplace(w.spec.key)
                self.predictor.progressed((w.spec.prompt, w.spec.sample), _generated(w))
            work: list[Work] = [*exported, *slot.pending]
            work.sort(key=lambda w: -self._estimate(_spec(w).prompt))
            self.num_spread += len(exported)
            run.num_migrated += len(exported)
            if run._slots.get(device.index) is slot:
                del run._slots[device.index]
                run.queue.extendleft(reversed(work))
                run.add_devices([device])  # back, empty: dispatch spreads the work
            else:  # taken meanwhile (`requeue`): the work goes back without it
                run.queue.extendleft(reversed(work))
                run._dispatch()
        finally:
            self._spreading = None


def _generated(work: InflightRequest) -> int:
    """Tokens an exported request has generated (the twin's carry a count only)."""
    return int(getattr(work, "num_generated", 0)) or len(work.generated)
