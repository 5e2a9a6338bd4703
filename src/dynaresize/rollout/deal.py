"""Dealing a queue over engines level by level, with seats for engines still to come.

`seats` is the order in which queued requests go out in one dispatch: level by level from
the lowest load, each level in engine index order (what the one-by-one greedy of
`SlotTable.deal_greedy` does, in O(dispatched + engines log engines): `SlotTable.deal_bulk`,
the run's dispatch of a long queue). It can also hold seats for engines on their way.

Why the seats: a pipelined run starts on a few engines and gains the rest as the previous
step's tail empties them (`RolloutRun`'s `arrivals`); each joins alone, so the greedy
dispatch gave each newcomer its whole share, ceil(remaining / expected), as one contiguous
block of the queue. The queue is in prompt order, so a block is a few whole groups: one
prompt's length (and the group's correlated response lengths) on one engine, 3.25 groups an
engine at 512 requests over 42 engines, prompt tokens per engine from 10k to 24k where
dealing all of them at once (the bulk dispatch of an unpipelined start) spreads 11k to 17k.
The ceilings also overcommitted: 40 engines took 13 each and the last two joined to an empty
queue. That made the pipelined run ~1% slower than the unpipelined one on a tailless workload
(bench/unseen.py run 13).

With seats, the queue goes out as if every engine on its way (it left the previous tail, or was
free, and loads the run's version: `EnginePool.arriving`) were present: round robin, level by
level from the lowest load (the bulk dispatch's order, `SlotTable.deal_bulk`), where
each engine still to come holds a seat at load 0 whose requests stay queued for it. So the
k-th engine to join takes what the k-th seat of one deal over all of them would get, whatever
order they join in. Engines still serving the previous tail are not counted: they may come
seconds later, and the requests left for them stay the queue's back, whole groups, as before
(dealing over them too spread the late starts over many groups: dapo-7b, 1024 GPUs, 16384
requests, `fixed` at 512 rollout devices, 6 steps: 154.0 -> 142.2 samples/s; fewer groups
complete early for streaming training, and a late start hits more independent lengths).
Which engine runs a request never changes its tokens (design §2.3).
"""

from __future__ import annotations

import bisect


def seats(loads: dict[int, int], num_coming: int, limit: int, num_items: int
          ) -> list[int | None]:
    """Who takes each of the next (at most) `num_items` queued requests: the present engines
    (`loads`: engine index -> requests it holds, each below `limit`) and `num_coming` engines
    still to come (load 0), each up to `limit` requests. At each load level from 0, every
    present engine at or below that level (in index order), then every seat to come, takes
    the next request. Entry k: the engine index that takes request k, or None for a seat to
    come (that request stays queued for it); as long as the queue or the seats last."""
    order: list[int | None] = []
    waiting = sorted((load, index) for index, load in loads.items())
    active: list[int] = []
    """Present engines at the current level, in index order (each takes one per level)."""
    j = 0
    for level in range(limit):
        if len(order) >= num_items:
            break
        while j < len(waiting) and waiting[j][0] <= level:
            bisect.insort(active, waiting[j][1])
            j += 1
        order.extend(active[:num_items - len(order)])
        order.extend([None] * min(num_coming, num_items - len(order)))
    return order


def seat_positions(loads: dict[int, int], num_coming: int, limit: int, num_items: int
                   ) -> list[tuple[int, int]]:
    """`seats` without its seats to come: (k, engine index) for every entry k of
    `seats(loads, num_coming, limit, num_items)` that is not None, in order; in
    O(dispatched + engines log engines + limit), not O(num_items)."""
    out: list[tuple[int, int]] = []
    waiting = sorted((load, index) for index, load in loads.items())
    active: list[int] = []
    j = pos = 0
    for level in range(limit):
        if pos >= num_items:
            break
        while j < len(waiting) and waiting[j][0] <= level:
            bisect.insort(active, waiting[j][1])
            j += 1
        take = active[:num_items - pos]
        out.extend(zip(range(pos, pos + len(take)), take))
        pos += len(take)
        pos += min(num_coming, num_items - pos)
    return out
