"""Dealing a queue over engines that join one at a time (a pipelined run's start).

A pipelined run starts on a few engines and gains the rest as the previous step's tail
empties them (`RolloutRun.expected_devices`); each joins alone, so the greedy dispatch gave
each newcomer its whole share, ceil(remaining / expected), as one contiguous block of the
queue. The queue is in prompt order, so a block is a few whole groups: one prompt's length
(and the group's correlated response lengths) on one engine, 3.25 groups an engine at 512
requests over 42 engines, prompt tokens per engine from 10k to 24k where dealing all of them
at once (the bulk dispatch of an unpipelined start) spreads 11k to 17k. The ceilings also
overcommitted: 40 engines took 13 each and the last two joined to an empty queue. That made
the pipelined run ~1% slower than the unpipelined one on a tailless workload (bench/unseen.py
run 13).

`deal` hands out the queue as if every engine on its way (it left the previous tail, or was
free, and loads the run's version: `EnginePool.arriving`) were present: round robin, level by
level from the lowest load (the bulk dispatch's order, `RolloutRun._dispatch_bulk`), where
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
from collections.abc import Sequence
from typing import TypeVar

W = TypeVar("W")


def deal(queue: Sequence[W], loads: dict[int, int], num_coming: int, limit: int
         ) -> tuple[dict[int, list[W]], list[W]]:
    """Deal `queue` over the present engines (`loads`: engine index -> requests it holds)
    and `num_coming` engines still to come (load 0), each up to `limit` requests: at each
    load level from 0, every present engine at or below that level (in index order), then
    every seat to come, takes the next request. Returns (requests each present engine gets,
    the requests left queued, in queue order: the seats to come's and what is over)."""
    given: dict[int, list[W]] = {index: [] for index in loads}
    kept: list[W] = []
    waiting = sorted((load, index) for index, load in loads.items())
    active: list[int] = []
    """Present engines at the current level, in index order (each takes one per level)."""
    pos, n, j = 0, len(queue), 0
    for level in range(limit):
        if pos >= n:
            break
        while j < len(waiting) and waiting[j][0] <= level:
            bisect.insort(active, waiting[j][1])
            j += 1
        for index in active:
            if pos >= n:
                break
            given[index].append(queue[pos])
            pos += 1
        take = min(num_coming, n - pos)
        kept.extend(queue[pos:pos + take])
        pos += take
    kept.extend(queue[pos:])
    return {index: work for index, work in given.items() if work}, kept
