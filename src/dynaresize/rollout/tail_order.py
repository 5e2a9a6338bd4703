"""TailOrder: a run's dispatch order by predicted length, and which engine its thin tail spreads.

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
  another holds at least `spread_min_load` requests, the most loaded engine (`spread_source`)
  finishes its slice, exports its requests (token prefix and sampler state: they continue
  unchanged elsewhere, design §2.3) and takes work again; its requests are requeued in front,
  longest predicted first (`spread_work`), and dispatch deals them to the emptiest engines;
  the run does the moving (`RolloutRun`'s export-and-requeue). One engine at a time; not while the
  run hands its engines to the next step (then `pack_batch` packs the tail instead) nor while
  `may_spread()` says no (a resize pending). The orchestrator enables it for non-pipelined
  runs only: a pipelined run's engine that is away exporting would look free to the next
  step (`EnginePool.adopt_free_engines`).

Which engine runs a request, and when, never changes its tokens: only time changes.

A pure queue strategy: it reads and reorders the queue it is given and keeps its predictions;
it knows no run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.protocols import Clock
from dynaresize.rollout.lengths import LengthPredictor
from dynaresize.rollout.slots import Work

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


class TailOrder:
    """One run's `rollout.tail_policy` (module docstring), owned by the `RolloutRun`."""

    def __init__(self, clock: Clock, num_requests: int, spread: bool,
                 spread_min_load: int = 2, predictor: LengthPredictor | None = None) -> None:
        self.clock = clock
        self.spread = spread
        self.spread_min_load = spread_min_load
        self.predictor = predictor if predictor is not None else LengthPredictor()
        self.num_spread = 0
        """Requests spreading moved to another engine."""
        self._since_sort = 0
        self._resort_every = max(1, int(RESORT_FRACTION * num_requests))
        self._work: dict[int, float] = {}
        """engine -> predicted tokens of the requests dispatched to it (at dispatch)."""
        self._total_work = 0.0
        self._placed: dict[tuple[int, int, int], tuple[int, float]] = {}
        self.estimate: Callable[[int], float] = self._estimate
        """Predicted response tokens of a prompt's requests now (replaceable in tests)."""

    def _estimate(self, prompt: int) -> float:
        return self.predictor.estimate(prompt, self.clock.now())

    def first_order(self, requests: Sequence[Work]) -> list[Work]:
        """The queue a run starts with (`probe_order`)."""
        return probe_order(requests)

    def resort(self, queue: deque[Work], force: bool = False) -> None:
        """Re-sort `queue` if enough completions arrived since the last sort (`force`: now)."""
        if (self._since_sort < self._resort_every and not force) or len(queue) < 2:
            return
        self._since_sort = 0
        ordered = longest_first(queue, self.estimate)
        queue.clear()
        queue.extend(ordered)

    def take(self, queue: deque[Work], index: int) -> Work:
        """The queued work engine `index` gets next: migrated work first; else the longest
        predicted if the engine's predicted work is at most the engines' mean, the shortest
        if above (the queue is sorted longest first), so long requests spread evenly."""
        work = self._work
        head = queue[0]
        if isinstance(head, InflightRequest):
            w = queue.popleft()
        else:
            mine = work.get(index, 0.0)
            w = queue.popleft() if mine * len(work) <= self._total_work or not work \
                else queue.pop()
        spec = _spec(w)
        self._unplace(spec.key)  # requeued (migrated, or its engine died): placed anew
        tokens = self.estimate(spec.prompt)
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
        now_s, predictor = self.clock.now(), self.predictor
        for w in work:
            spec = _spec(w)
            predictor.dispatched((spec.prompt, spec.sample), now_s)

    def completed(self, completions: Sequence[Completion]) -> None:
        now_s, predictor = self.clock.now(), self.predictor
        for c in completions:
            self._unplace(c.spec.key)
            predictor.finished((c.spec.prompt, c.spec.sample), c.num_tokens, now_s)
        self._since_sort += len(completions)

    def spread_source(self, loads: dict[int, int]) -> int | None:
        """The engine to spread now (`spread_source`), None if none or spreading is off."""
        return spread_source(loads, self.spread_min_load) if self.spread else None

    def spread_work(self, exported: Sequence[InflightRequest], pending: Sequence[Work]
                    ) -> list[Work]:
        """A spread engine's requests in the order they are requeued: longest predicted
        first (what they generated so far updates the predictions)."""
        for w in exported:
            self._unplace(w.spec.key)
            self.predictor.progressed((w.spec.prompt, w.spec.sample), w.num_done())
        work: list[Work] = [*exported, *pending]
        work.sort(key=lambda w: -self.estimate(_spec(w).prompt))
        self.num_spread += len(exported)
        return work
