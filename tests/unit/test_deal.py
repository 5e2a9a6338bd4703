"""`rollout.deal.seats` and a pipelined `RolloutRun` whose engines join one at a time."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

from dynaresize.core.types import Completion
from dynaresize.protocols import RealClock
from dynaresize.rollout.deal import seats
from dynaresize.rollout.run import RolloutRun, RunSettings
from dynaresize.rollout.slots import SlotTable
from tests.unit.test_rollout_run import Arrivals, FakeEngine, specs


def deal(queue: list[int], loads: dict[int, int], num_coming: int, limit: int
         ) -> tuple[dict[int, list[int]], list[int]]:
    """`seats` applied to a list: (requests each present engine gets, what stays queued, in
    queue order)."""
    plan = seats(loads, num_coming, limit, len(queue))
    given: dict[int, list[int]] = {}
    kept: list[int] = []
    for request, index in zip(queue, plan):
        (kept if index is None else given.setdefault(index, [])).append(request)
    return given, kept + queue[len(plan):]


def test_engines_dealt_one_at_a_time_get_one_deal_over_all() -> None:
    """The k-th engine to join takes what the k-th seat of one round-robin deal over every
    expected engine gets: 512 requests over 42 engines, 8 hold 13 and 34 hold 12 (none
    empty), and engine k gets requests k, k + 42, ..."""
    queue, num_expected, limit = list(range(512)), 42, -(-512 // 42)
    got: dict[int, list[int]] = {}
    for k in range(num_expected):
        given, queue = deal(queue, {k: 0}, num_expected - k - 1, limit)
        got[k] = given.get(k, [])
    assert not queue
    assert all(got[k] == list(range(k, 512, num_expected)) for k in got)
    assert sorted(len(v) for v in got.values()) == [12] * 34 + [13] * 8


def test_deal_serves_lower_loads_first_and_caps_at_the_limit() -> None:
    """Level by level from load 0: a seat still to come (load 0) reserves before an engine
    that already holds work; nobody exceeds `limit`; what is over stays queued."""
    given, kept = deal(list(range(10)), {3: 0, 5: 2}, 1, 3)
    # level 0: engine 3, then the seat to come; level 1: the same; level 2: 3, 5, seat
    assert given == {3: [0, 2, 4], 5: [5]} and kept == [1, 3, 6, 7, 8, 9]


def test_a_pipelined_run_deals_joiners_across_groups() -> None:
    """Engines joining a pipelined run one at a time while the others are on their way each
    get requests of different groups (one deal over all of them), not a block of whole
    groups; every request completes once."""
    async def main() -> tuple[dict[int, list[int]], list[Completion]]:
        engines = [FakeEngine(i) for i in range(4)]
        coming = {0, 1, 2, 3}  # all on their way (loading weights)
        run = RolloutRun(RealClock(), specs(40), RunSettings(0, 16, 1.0),
                         on_completions=lambda c: None, arrivals=Arrivals(4, coming))
        prompts = {}
        for engine in engines:  # one at a time, as they leave the previous step's tail
            coming.discard(engine.index)
            run.add_devices([engine])
            prompts[engine.index] = [w.prompt for w in run.pending_of(engine.index)]
        await run.wait()
        return prompts, run.progress.completions

    prompts, completions = asyncio.run(main())
    assert sorted(c.spec.key for c in completions) == sorted(s.key for s in specs(40))
    assert all(len(p) == 10 and len(set(p)) == 10 for p in prompts.values())  # 10 groups each


def test_a_limit_that_rises_reaches_the_slots_full_at_the_old_one() -> None:
    """A pipelined run's share cap rises when dynamic sampling tops it up or the pool shrinks
    under it: slots that were full at the old cap (left out of the dispatch heap) take work at
    the new one at once, not at their next completion."""
    table = SlotTable()
    for index in (0, 1):
        table.add(SimpleNamespace(index=index))  # type: ignore[arg-type]
    queue: deque[int] = deque(range(6))
    table.deal_greedy(queue, 2, lambda index: queue.popleft())  # type: ignore[arg-type,return-value]
    assert [s.load for s in table] == [2, 2] and len(queue) == 2
    table.deal_greedy(queue, 3, lambda index: queue.popleft())  # type: ignore[arg-type,return-value]
    assert [s.load for s in table] == [3, 3] and not queue
