"""`fork_map`: a function over items in forked worker processes, where cores allow.

The twin's runs are pure functions of their inputs (virtual time, seeded workloads), so the
same run gives the same numbers in any process: `simulate` runs the split search's probes and
the policies' runs side by side this way. Workers are forked (Linux), so they inherit the
parent's workload, cost model and closures without pickling them; only the items and the
results cross (small: split sizes, policy names, result rows). Elsewhere, with one worker or
one item, the items run here, in order.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_FN: Callable[[Any], Any] | None = None
"""The function the forked workers of the current `fork_map` call (inherited at the fork)."""


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def _call(item: Any) -> Any:
    assert _FN is not None
    return _FN(item)


def _worker_start() -> None:
    """A forked worker drops the signal handlers it inherited: a Ray driver's SIGTERM handler,
    for one, would drain and kill the parent's Ray node from inside the worker (and hang it)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def fork_map(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """`[fn(x) for x in items]`, computed by up to `workers` forked processes (each takes the
    next item as it finishes one: put the longest first). An exception in `fn` is raised
    here."""
    global _FN
    items = list(items)
    if workers <= 1 or len(items) <= 1 or not can_fork() or _FN is not None \
            or multiprocessing.current_process().daemon:
        return [fn(x) for x in items]  # (no forks from within a worker: daemons have none)
    _FN = fn
    try:
        context = multiprocessing.get_context("fork")
        with context.Pool(min(workers, len(items)), _worker_start) as pool:
            out = pool.map(_call, items, chunksize=1)
            pool.close()  # the workers end by themselves once the queue is done, so the
            pool.join()  # exit's terminate (kept for errors) has no worker left to signal
            return out
    finally:
        _FN = None
