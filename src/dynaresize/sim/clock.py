"""Virtual time for asyncio: the `Clock` of the digital twin.

`VirtualClock` implements the `Clock` protocol (`now()`, `async sleep()`), and
`VirtualClock.run(coro)` runs a coroutine to completion on a `VirtualEventLoop`: a selector
event loop whose `time()` is the clock's virtual time and whose selector never blocks. When
nothing is ready, instead of waiting it *jumps* virtual time to the next timer. So
`asyncio.sleep`, `wait_for`, timeouts, `Event`, `Queue`, `gather` and task cancellation all
work unchanged, and a 1000-second simulation costs only the callbacks it runs.

Loop iteration, as asyncio's `_run_once` does it::

    timeout = 0 if callbacks are ready else (next timer - time())   # None: no timer at all
    selector.select(timeout)   # here: poll real fds once, then advance virtual time by timeout
    run the timers that are due, then the ready callbacks

`VirtualClock.sleep` keeps its own heap of plain (time, seq, future) tuples (the simulator's
hot path: one sleep per modelled operation); the selector jumps to whichever comes first, an
asyncio timer or a clock wake-up. If nothing is ready and no timer or wake-up is pending,
the program can never make progress in virtual time (every task waits on something that
nobody will set): `select(None)` raises
`VirtualTimeDeadlock` rather than hanging. Threads (`run_in_executor`) are not virtual-time
aware and must not be used under a virtual clock.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import selectors
from asyncio import format_helpers
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeDeadlock(RuntimeError):
    """Nothing is runnable and no timer is pending: virtual time cannot advance."""


class VirtualClock:
    """Virtual seconds since `start_s`; advanced only by the event loop it drives.

    Consumes nothing; `now()` produces the current virtual time in seconds. `sleep(s)` is
    `asyncio.sleep(s)`, which under a `VirtualEventLoop` of this clock takes `s` virtual seconds
    and no wall time.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = float(start_s)
        self._wakeups: list[tuple[float, int, asyncio.Future[None]]] = []
        """(virtual time, sequence, future) of `sleep` calls: plain tuples, so the heap
        compares in C (asyncio's TimerHandle compares in Python: ~10% of a large run)."""
        self._seq = itertools.count()

    def now(self) -> float:
        """Current virtual time, seconds."""
        return self._now_s

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling task for `seconds` of virtual time. Under this clock's own
        loop the wake-up goes on the clock's tuple heap (fired by the loop's selector when
        time reaches it); elsewhere it is `asyncio.sleep`."""
        loop = asyncio.get_running_loop()
        if seconds <= 0 or getattr(loop, "_virtual_clock", None) is not self:
            await asyncio.sleep(max(0.0, seconds))
            return
        future: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._wakeups, (self._now_s + seconds, next(self._seq), future))
        await future

    def after(self, seconds: float) -> Awaitable[None]:
        """What `sleep(seconds)` does, as an awaitable without a coroutine frame (the hot path
        of `SimDevice`): under this clock's loop, a future woken `seconds` from now (the same
        wake-up order as `sleep`); elsewhere `asyncio.sleep`."""
        loop = asyncio.get_running_loop()
        if seconds <= 0 or getattr(loop, "_virtual_clock", None) is not self:
            return asyncio.sleep(max(0.0, seconds))
        future: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._wakeups, (self._now_s + seconds, next(self._seq), future))
        return future

    def next_wakeup_s(self) -> float | None:
        """Virtual time of the earliest pending `sleep` (cancelled ones dropped), or None."""
        heap = self._wakeups
        while heap and heap[0][2].done():
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def wake_until(self, t_s: float) -> None:
        """Move time to `t_s` (not backwards) and wake every `sleep` due by then, in order."""
        self._now_s = max(self._now_s, t_s)
        heap = self._wakeups
        while heap and heap[0][0] <= self._now_s:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)

    def advance(self, seconds: float) -> None:
        """Move virtual time forward by `seconds` (>= 0). Used by the loop's selector."""
        if seconds < 0:
            raise ValueError(f"advance: seconds = {seconds!r}: must be >= 0")
        self._now_s += seconds

    def new_event_loop(self) -> VirtualEventLoop:
        """A fresh event loop driven by this clock."""
        return VirtualEventLoop(self)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` to completion in virtual time on a fresh loop; return its result.

        Like `asyncio.run`: tasks left over are cancelled and async generators closed.
        Raises `VirtualTimeDeadlock` if the program blocks forever.
        """
        with asyncio.Runner(loop_factory=self.new_event_loop) as runner:
            return runner.run(coro)


POLL_EVERY = 64
"""With only the loop's self-pipe registered, real fds are polled on every POLL_EVERY-th
select (a callback from `call_soon_threadsafe` is already queued; the pipe only wakes a
blocked loop, and this one never blocks) and before declaring a deadlock."""


class _VirtualSelector(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
    """A real selector polled without blocking; a wait becomes a jump of virtual time."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock
        self._calls = 0

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        # Real fds (the loop's self-pipe for call_soon_threadsafe) are still honoured.
        self._calls += 1
        if len(self._fd_to_key) > 1 or not self._calls % POLL_EVERY:
            events = super().select(0)
            if events:
                return events
        if timeout == 0:
            return []
        wake_s = self._clock.next_wakeup_s()
        if wake_s is not None and (timeout is None or wake_s <= self._clock.now() + timeout):
            self._clock.wake_until(wake_s)
            return []
        if timeout is None:
            events = super().select(0)
            if events:
                return events
            raise VirtualTimeDeadlock(
                f"virtual time {self._clock.now():.6f} s: no task is runnable and no timer is "
                "pending (every task waits on an event nobody will set)")
        self._clock.advance(timeout)
        return []


class _Handle(asyncio.Handle):
    """`asyncio.Handle` without the per-handle debug check (debug loops use the base)."""

    __slots__ = ()

    def __init__(self, callback: Any, args: tuple[Any, ...], loop: asyncio.AbstractEventLoop,
                 context: contextvars.Context | None = None) -> None:
        self._context = context if context is not None else contextvars.copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose `time()` is a `VirtualClock` and which never blocks.

    `call_soon` and `_run_once` have lean paths (no debug checks; no timer bookkeeping while
    no asyncio timer is pending): the simulator runs one loop iteration per modelled event.
    A debug loop, or one with `call_later` timers pending, takes asyncio's own paths."""

    def __init__(self, clock: VirtualClock) -> None:
        self._virtual_clock = clock
        super().__init__(selector=_VirtualSelector(clock))

    @property
    def clock(self) -> VirtualClock:
        """The clock this loop advances."""
        return self._virtual_clock

    def time(self) -> float:
        return self._virtual_clock._now_s

    def set_debug(self, enabled: bool) -> None:
        super().set_debug(enabled)
        # every Future and Task asks `loop.get_debug()`: a C method-wrapper, not a Python call
        self.get_debug = bool(enabled).__bool__  # type: ignore[method-assign]

    def call_soon(self, callback: Any, *args: Any,
                  context: contextvars.Context | None = None) -> asyncio.Handle:
        if self._debug or self._closed:  # type: ignore[attr-defined]
            return super().call_soon(callback, *args, context=context)
        handle = _Handle(callback, args, self, context)
        self._ready.append(handle)  # type: ignore[attr-defined]
        return handle

    def _run_once(self) -> None:
        if self._scheduled or self._debug:  # type: ignore[attr-defined]
            super()._run_once()  # type: ignore[misc]
            return
        ready = self._ready  # type: ignore[attr-defined]
        selector = self._selector  # type: ignore[attr-defined]
        if not (ready or self._stopping) and len(selector._fd_to_key) <= 1:  # type: ignore
            # the common case, inlined: nothing runnable, so jump to the next wake-up
            clock = self._virtual_clock
            heap = clock._wakeups
            while heap and heap[0][2].done():
                heapq.heappop(heap)
            if heap:
                clock.wake_until(heap[0][0])
                events = None
            else:
                events = selector.select(None)  # polls real fds, else VirtualTimeDeadlock
        else:
            events = selector.select(0 if ready or self._stopping else None)
        if events:
            self._process_events(events)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            try:  # `handle._run()` inlined (one frame less per callback), same error path
                handle._context.run(handle._callback, *handle._args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                cb = format_helpers._format_callback_source(handle._callback, handle._args)
                context = {"message": f"Exception in callback {cb}", "exception": exc,
                           "handle": handle}
                if handle._source_traceback:
                    context["source_traceback"] = handle._source_traceback
                self.call_exception_handler(context)
        handle = None  # break cycles when an exception occurred


def run_virtual(coro: Coroutine[Any, Any, T], start_s: float = 0.0) -> tuple[T, float]:
    """Run `coro` in virtual time from `start_s`; return (its result, virtual end time in s).

    The coroutine can reach its clock with `asyncio.get_running_loop().clock`.
    """
    clock = VirtualClock(start_s)
    result = clock.run(coro)
    return result, clock.now()
