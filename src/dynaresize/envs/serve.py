"""Serving episode turns from engines in one event loop: a `GenerateTurn` for envs.driver.

`EngineTurns` owns a few engines (the builtin `RolloutEngine` through `InlineEngine`, or a fake
with an async step in tests) and one serve loop per engine. A turn request goes to the least
loaded engine; the loop steps its engine while it has work and waits only when it has none, so
an engine never idles while requests are queued on it, whatever tools are running: the
environment's wait is the driver's `await`, not the engine's. Each loop keeps its busy
intervals (clock seconds inside `step`), from which `overlap_s` reports how much engine work
ran during environment waits. If a serve loop dies (its engine's `step` raises, or anything
else in the loop), the server fails: every pending turn and every later call raises that
loop's error, and so does leaving `serving()`; no caller waits forever.

Migrations and deaths, for tests of the contract (design §2.3) in miniature:

* `migrate(src, dst)`: every request of engine `src` moves to `dst` with its token prefix and
  sampler state (`export_inflight`): mid-turn migration;
* `kill(src, dst)`: engine `src`'s state is lost; its requests restart on `dst` from their spec
  (prompt = the episode context, same seed), so the turn is generated again, identically.

Neither steps an environment: environments are stepped by the driver through the episode log.
This is a stand-in for the rollout loop, which owns engines in a real run (issue 26: wiring).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.envs.driver import TurnRequest
from dynaresize.protocols import Clock


class SteppedEngine(Protocol):
    """What `EngineTurns` needs of an engine (the builtin one, via `InlineEngine`)."""

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    def add(self, item: RequestSpec | InflightRequest) -> None: ...

    def export_inflight(self) -> list[InflightRequest]: ...

    async def step(self) -> list[Completion]: ...


class SyncEngine(Protocol):
    num_waiting: int
    num_running: int

    def add(self, item: RequestSpec | InflightRequest) -> None: ...

    def export_inflight(self) -> list[InflightRequest]: ...

    def step(self) -> list[Completion]: ...


class InlineEngine:
    """A synchronous engine (`rollout.engine.RolloutEngine`) stepped inline in the loop."""

    def __init__(self, engine: SyncEngine) -> None:
        self.engine = engine

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    def add(self, item: RequestSpec | InflightRequest) -> None:
        self.engine.add(item)

    def export_inflight(self) -> list[InflightRequest]:
        return self.engine.export_inflight()

    async def step(self) -> list[Completion]:
        return self.engine.step()


@dataclass
class ServeStats:
    busy: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) clock seconds of each `step`."""
    turns: int = 0
    """Completions delivered."""

    @property
    def busy_s(self) -> float:
        return sum(end - start for start, end in self.busy)


class EngineTurns:
    """Serve `TurnRequest`s from `engines` (see module docstring); call it as a GenerateTurn."""

    def __init__(self, engines: Sequence[SteppedEngine], clock: Clock) -> None:
        if not engines:
            raise ValueError("EngineTurns needs at least one engine")
        self.engines = list(engines)
        self.clock = clock
        self.stats = [ServeStats() for _ in self.engines]
        self.live = [True] * len(self.engines)
        self._futures: dict[tuple[int, int, int], asyncio.Future[Completion]] = {}
        self._wake = [asyncio.Event() for _ in self.engines]
        self._stop = False
        self.error: BaseException | None = None
        """The error a serve loop died of (the server is then failed); None while serving."""

    def _pick(self) -> int:
        loads = [(e.num_waiting + e.num_running, i) for i, e in enumerate(self.engines)
                 if self.live[i]]
        return min(loads)[1]

    async def __call__(self, request: TurnRequest) -> Completion:
        """The turn's completion; raises the error of a dead serve loop (`error`), or the
        engine's refusal of the request (nothing is left in flight then)."""
        if self.error is not None:
            raise self.error
        key = request.spec.key
        if key in self._futures:
            raise RuntimeError(f"turn {request.key}: its episode already has a turn in flight")
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        i = self._pick()
        self.engines[i].add(request.spec)
        self._futures[key] = future
        self._wake[i].set()
        return await future

    async def _serve(self, i: int) -> None:
        """Engine `i`'s serve loop; if it dies, the whole server fails with its error
        (`_fail`), so no turn waits for a loop that is gone."""
        try:
            await self._serve_loop(i)
        except Exception as exc:
            self._fail(exc)

    async def _serve_loop(self, i: int) -> None:
        engine, stats, wake = self.engines[i], self.stats[i], self._wake[i]
        while not self._stop:
            if not self.live[i] or engine.num_waiting + engine.num_running == 0:
                wake.clear()
                await wake.wait()
                continue
            start = self.clock.now()
            done = await engine.step()
            if self.error is not None:  # another loop died meanwhile: its turns are failed
                return
            stats.busy.append((start, self.clock.now()))
            for completion in done:
                future = self._futures.pop(completion.spec.key, None)
                if future is None:
                    raise RuntimeError(f"engine {i} completed request {completion.spec.key}, "
                                       f"which no turn awaits")
                stats.turns += 1
                future.set_result(completion)
            await asyncio.sleep(0)  # let drivers and tools run between decode iterations

    def _fail(self, exc: Exception) -> None:
        """A serve loop died of `exc`: fail every pending turn with it (later calls raise it,
        `__call__`), and stop every loop."""
        if self.error is None:
            self.error = exc
        for future in self._futures.values():
            if not future.done():
                future.set_exception(exc)
        self._futures.clear()
        self._stop = True
        for wake in self._wake:
            wake.set()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[EngineTurns]:
        """Run the serve loops for the duration of the block; leaving it raises the error a
        loop died of (unless the block raised its own)."""
        tasks = [asyncio.create_task(self._serve(i)) for i in range(len(self.engines))]
        try:
            yield self
        finally:
            self._stop = True
            for wake in self._wake:
                wake.set()
            await asyncio.gather(*tasks)
        if self.error is not None:
            raise self.error

    def _move(self, src: int, dst: int, keep_prefix: bool) -> int:
        if not self.live[dst] or src == dst:
            raise ValueError(f"cannot move requests from engine {src} to engine {dst}")
        moved = self.engines[src].export_inflight()
        for item in moved:
            self.engines[dst].add(item if keep_prefix else item.spec)
        self._wake[dst].set()
        return len(moved)

    def migrate(self, src: int, dst: int) -> int:
        """Move engine `src`'s requests, with their prefixes, to `dst`; how many moved."""
        return self._move(src, dst, keep_prefix=True)

    def kill(self, src: int, dst: int) -> int:
        """Engine `src` dies: its requests restart from scratch on `dst`; how many."""
        self.live[src] = False
        return self._move(src, dst, keep_prefix=False)


def overlap_s(busy: Sequence[tuple[float, float]], waits: Sequence[tuple[float, float]]) -> float:
    """Seconds of `busy` intervals that fall inside the union of `waits` intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(waits):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    total = 0.0
    for b0, b1 in busy:
        for w0, w1 in merged:
            total += max(0.0, min(b1, w1) - max(b0, w0))
    return total
