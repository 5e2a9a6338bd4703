"""RolloutRun in-process with fake devices: dispatch, completion, devices leaving mid-step."""

from __future__ import annotations

import asyncio

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.protocols import RealClock
from dynaresize.rollout.run import RolloutRun, RunSettings


class FakeEngine:
    """Finishes each request after `spec.max_new_tokens` slices of one token each."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.running: list[InflightRequest] = []
        self.max_seen = 0

    async def submit(self, requests: list) -> None:
        for r in requests:
            self.running.append(r if isinstance(r, InflightRequest) else InflightRequest(r))
        self.max_seen = max(self.max_seen, len(self.running))

    async def run_rollout(self, max_s: float) -> list[Completion]:
        await asyncio.sleep(0)
        done = []
        for r in self.running:
            r.generated.append(len(r.generated) + r.spec.sample)
        for r in list(self.running):
            if len(r.generated) >= r.spec.max_new_tokens:
                self.running.remove(r)
                done.append(Completion(r.spec, list(r.generated), [0.0] * len(r.generated),
                                       "length", self.index, 0))
        return done

    async def export_inflight(self) -> list[InflightRequest]:
        out, self.running = self.running, []
        return out


class Arrivals:
    """The engine pool's view a pipelined run reads: engines expected, engines on their way."""

    def __init__(self, expected: int, coming: set[int]) -> None:
        self.expected = expected
        self.coming = coming

    def num_rollout_devices(self) -> int:
        return self.expected

    def arriving(self) -> set[int]:
        return set(self.coming)


def specs(n: int) -> list[RequestSpec]:
    return [RequestSpec(0, i // 4, i % 4, 0, (1,), 1 + (i * 7) % 9, i) for i in range(n)]


def test_every_request_completes_once_within_capacity() -> None:
    async def main() -> tuple[list[Completion], list[FakeEngine]]:
        engines = [FakeEngine(i) for i in range(3)]
        run = RolloutRun(RealClock(), specs(40), RunSettings(0, 4, 1.0),
                         on_completions=lambda c: None)
        run.add_devices(engines)
        await run.wait()
        return run.progress.completions, engines

    completions, engines = asyncio.run(main())
    assert sorted(c.spec.key for c in completions) == sorted(s.key for s in specs(40))
    assert all(e.max_seen <= 4 for e in engines)
    assert {c.device for c in completions} == {0, 1, 2}


def test_leaving_device_migrates_its_requests_without_changing_tokens() -> None:
    async def main() -> list[Completion]:
        engines = [FakeEngine(i) for i in range(2)]
        run: RolloutRun

        def on_done(done: list[Completion]) -> None:
            if run.progress.num_finished >= 10 and not moved:
                moved.append(asyncio.ensure_future(leave(engines[1])))

        async def leave(engine: FakeEngine) -> None:
            await run.stop_admission(engine)
            left_at.append(len(run.progress.completions))
            exported = await engine.export_inflight()
            migrated.extend(exported)
            run.requeue(engine, exported)

        moved: list = []
        migrated: list = []
        left_at: list[int] = []
        run = RolloutRun(RealClock(), specs(32), RunSettings(0, 8, 1.0),
                         on_completions=on_done)
        run.add_devices(engines)
        await run.wait()
        await asyncio.gather(*moved)
        assert migrated, "the test must migrate something"
        assert all(c.device == 0 for c in run.progress.completions[left_at[0]:])
        return run.progress.completions

    completions = asyncio.run(main())
    keys = [c.spec.key for c in completions]
    assert len(keys) == len(set(keys)) == 32
    for c in completions:  # tokens are a function of the request only
        assert c.tokens == [j + c.spec.sample for j in range(c.spec.max_new_tokens)]


def test_hand_off_releases_idle_devices_and_keeps_the_last_until_the_end() -> None:
    """Pipelined rollouts: once the queue is empty, a device with nothing left leaves for
    the next step (`hand_off`), those idle at the call at once; the last device stays until
    every request completed, then goes too; no request is lost or run twice."""
    async def main() -> tuple[list[Completion], list[tuple[int, int]], bool]:
        engines = [FakeEngine(i) for i in range(4)]
        run = RolloutRun(RealClock(), specs(12), RunSettings(0, 4, 1.0),
                         on_completions=lambda c: None)
        run.add_devices(engines)
        await run.drained.wait()  # 12 requests fit at once: the queue empties on dispatch
        run.add_devices([FakeEngine(4)])  # joins with nothing to do
        released: list[tuple[int, int]] = []  # (device, requests still unfinished)
        run.hand_off(lambda d: released.append((d.index, run.progress.remaining)))
        await run.wait()
        return run.progress.completions, released, run.finished.is_set()

    completions, released, finished = asyncio.run(main())
    assert sorted(c.spec.key for c in completions) == sorted(s.key for s in specs(12))
    assert released[0] == (4, 12)  # idle at the call: left at once
    assert sorted(d for d, _ in released) == [0, 1, 2, 3, 4] and finished
    # the others left as they emptied, the last one only once every request had completed
    assert all(remaining > 0 for _, remaining in released[:-1]) and released[-1][1] == 0


def test_a_run_waiting_for_devices_gives_each_only_its_share() -> None:
    """Pipelined runs start on a few engines: with `arrivals`, no engine takes more
    than ceil(remaining / expected) while the others are still to come; once they joined,
    every request completes."""
    async def main() -> tuple[int, list[Completion], list[FakeEngine]]:
        engines = [FakeEngine(i) for i in range(4)]
        run = RolloutRun(RealClock(), specs(40), RunSettings(0, 16, 1.0),
                         on_completions=lambda c: None, arrivals=Arrivals(4, set()))
        run.add_devices(engines[:1])
        first_load = len(run.pending_of(0))  # dispatched to it, before any slice ran
        await asyncio.sleep(0)
        run.add_devices(engines[1:])
        await run.wait()
        return first_load, run.progress.completions, engines

    first_load, completions, engines = asyncio.run(main())
    assert first_load == 10  # 40 requests, 4 devices expected (not 16, its max_running)
    assert sorted(c.spec.key for c in completions) == sorted(s.key for s in specs(40))
    assert all(e.max_seen <= 16 for e in engines) and {c.device for c in completions} \
        == {0, 1, 2, 3}


def test_a_deep_pipeline_gives_a_first_engine_share_factor_times_its_share() -> None:
    """`RunSettings.share_factor` (staleness >= 2, `pipeline.share_factor`): the first engine
    of a run waiting for the others takes twice ceil(remaining / expected); every request
    still completes once."""
    async def main() -> tuple[int, list[Completion]]:
        engines = [FakeEngine(i) for i in range(4)]
        run = RolloutRun(RealClock(), specs(40), RunSettings(0, 32, 1.0, share_factor=2),
                         on_completions=lambda c: None, arrivals=Arrivals(4, set()))
        run.add_devices(engines[:1])
        first_load = len(run.pending_of(0))
        await asyncio.sleep(0)
        run.add_devices(engines[1:])
        await run.wait()
        return first_load, run.progress.completions

    first_load, completions = asyncio.run(main())
    assert first_load == 20  # 2 x 40 / 4 (with factor 1: 10, the test above)
    assert sorted(c.spec.key for c in completions) == sorted(s.key for s in specs(40))


def test_packing_moves_a_thinning_tail_onto_fewer_engines() -> None:
    """Once handing off, with `pack_batch`, the least-loaded engine migrates its requests
    to the others as soon as they hold every remaining one at `pack_batch` each, and joins
    the next step; tokens are unchanged and every request completes once."""
    async def main() -> tuple[RolloutRun, list[tuple[int, int, int]]]:
        engines = [FakeEngine(i) for i in range(4)]
        run = RolloutRun(RealClock(), specs(24), RunSettings(0, 8, 1.0, pack_batch=4),
                         on_completions=lambda c: None)
        run.add_devices(engines)
        await run.drained.wait()
        released: list[tuple[int, int, int]] = []  # (device, unfinished, engines left)
        run.hand_off(lambda d: released.append(
            (d.index, run.progress.remaining, len(run.devices()))))
        await run.wait()
        return run, released

    run, released = asyncio.run(main())
    keys = [c.spec.key for c in run.progress.completions]
    assert sorted(keys) == sorted(s.key for s in specs(24)) and len(set(keys)) == 24
    for c in run.progress.completions:
        assert c.tokens == [j + c.spec.sample for j in range(c.spec.max_new_tokens)]
    assert run.progress.num_migrated > 0, "the test must pack something"
    assert sorted(d for d, _, _ in released) == [0, 1, 2, 3]
    # an engine left with work unfinished only while the rest held it at pack_batch each
    assert all(left * 4 >= remaining for _, remaining, left in released)
    # its tail began once 4 engines could hold the rest at light_batch (8) each
    held_s = sum(b - a for a, b in run.progress.busy_s.values())
    assert run.progress.light_s is not None and 0.0 < run.progress.tail_device_s() < held_s
    assert any(remaining > 0 and left >= 1 for _, remaining, left in released[:-1])


def test_an_engine_that_dies_while_packed_reruns_its_requests_elsewhere() -> None:
    """Packing exports the least-loaded engine's requests; if that export fails and the
    device is gone (`on_device_lost` says so), its requests rerun from scratch on the others
    (same tokens: they are a function of the request) and the run still completes each once;
    the dead engine is not handed to the next step."""
    class DiesOnExport(FakeEngine):
        async def export_inflight(self) -> list[InflightRequest]:
            raise RuntimeError("engine died")

    async def main() -> tuple[RolloutRun, list[int], list[int]]:
        engines = [FakeEngine(0), FakeEngine(1), DiesOnExport(2)]
        lost: list[int] = []
        run = RolloutRun(RealClock(), specs(18), RunSettings(0, 8, 1.0, pack_batch=9),
                         on_completions=lambda c: None,
                         on_device_lost=lambda d, exc: lost.append(d.index) is None)
        run.add_devices(engines)
        await run.drained.wait()
        released: list[int] = []
        # pack_batch 9: 2 engines x 9 hold all 18: pack at once; equal loads (6 each), so
        run.hand_off(lambda d: released.append(d.index))  # the highest index goes first
        await run.wait()
        return run, lost, released

    run, lost, released = asyncio.run(main())
    keys = [c.spec.key for c in run.progress.completions]
    assert sorted(keys) == sorted(s.key for s in specs(18)) and len(set(keys)) == 18
    for c in run.progress.completions:
        assert c.tokens == [j + c.spec.sample for j in range(c.spec.max_new_tokens)]
    assert lost == [2] and 2 not in released and run.progress.num_rerun > 0


class GatedEngine(FakeEngine):
    """Each `run_rollout` waits for `open_gate()`; it then completes every request it holds if
    `finish`, else none."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.gate: asyncio.Future[None] | None = None
        self.finish = False

    async def run_rollout(self, max_s: float) -> list[Completion]:
        self.gate = asyncio.get_running_loop().create_future()
        await self.gate
        if not self.finish:
            return []
        done = [Completion(r.spec, [0], [0.0], "length", self.index, 0) for r in self.running]
        self.running = []
        return done

    def open_gate(self, finish: bool) -> None:
        if self.gate is not None and not self.gate.done():
            self.finish = finish
            self.gate.set_result(None)


def test_an_engine_packed_away_is_leaving_before_another_may_go() -> None:
    """Regression (a live run hung at step 7 of 30): packing chose engine 1 and only marked
    it leaving once its `_evacuate` task started; in between, engine 0 completed its last
    request and left for the next step (engine 1 still counted as staying), then engine 1
    exported its request and left too: the run kept a request and no engine. The engine
    being packed is leaving from the moment it is chosen, so the last one stays."""
    async def main() -> tuple[RolloutRun, list[tuple[int, int, int]]]:
        engines = [GatedEngine(0), GatedEngine(1)]
        run = RolloutRun(RealClock(), specs(2), RunSettings(0, 1, 1.0, pack_batch=2),
                         on_completions=lambda c: None)
        run.add_devices(engines)  # one request each
        await run.drained.wait()
        for _ in range(3):  # both engines are now inside a slice
            await asyncio.sleep(0)
        assert all(e.gate is not None for e in engines)
        released: list[tuple[int, int, int]] = []  # (device, unfinished, engines staying)
        engines[0].open_gate(finish=True)  # its last request completes in this iteration...
        # ...while packing (pack_batch 2) picks engine 1 (equal loads: highest index)
        run.hand_off(lambda d: released.append(
            (d.index, run.progress.remaining, len(run.devices()))))
        for _ in range(200):  # engine 1's slice ends empty (exported); then all complete
            if run.finished.is_set():
                break
            engines[1].open_gate(finish=False)
            engines[0].open_gate(finish=True)
            await asyncio.sleep(0)
        return run, released

    run, released = asyncio.run(main())
    assert run.progress.num_migrated == 1, "the test must pack engine 1's request"
    assert all(left >= 1 for _, remaining, left in released if remaining), released
    assert run.finished.is_set() and sorted(c.spec.key for c in run.progress.completions) == \
        sorted(s.key for s in specs(2))


def test_an_engine_being_packed_away_is_still_held_and_busy_for_the_pool() -> None:
    """Regression (staleness 2, found by review): an engine a tail packs away exports its
    requests to the others and only then leaves; meanwhile it is not among `devices()` but
    the run still holds it (`held_devices`). The engine pool counted it free, so the next
    step could load new weights on it, or a resize hand it to training, mid-export."""
    from types import SimpleNamespace

    from dynaresize.orchestrator.engine_pool import EnginePool
    from dynaresize.orchestrator.engine_transit import EngineTransit

    async def main() -> tuple[list[int], list[int], set[int], list[int]]:
        engines = [GatedEngine(0), GatedEngine(1)]
        run = RolloutRun(RealClock(), specs(2), RunSettings(0, 1, 1.0, pack_batch=2),
                         on_completions=lambda c: None)
        run.add_devices(engines)  # one request each
        await run.drained.wait()
        for _ in range(3):  # both engines are now inside a slice
            await asyncio.sleep(0)
        pool = EnginePool(SimpleNamespace(devices=engines), RealClock(),  # type: ignore[arg-type]
                          None, None, EngineTransit())  # type: ignore[arg-type]
        pool.keep_tail(run)
        released: list[int] = []
        run.hand_off(lambda d: released.append(d.index))  # packs engine 1 (highest index)
        await asyncio.sleep(0)
        seen = (run.devices(), run.held_devices(), pool.tail_busy())
        for _ in range(200):
            if run.finished.is_set():
                break
            engines[1].open_gate(finish=False)
            engines[0].open_gate(finish=True)
            await asyncio.sleep(0)
        await run.wait()
        return (*seen, released)

    active, held, busy, released = asyncio.run(main())
    assert active == [0] and held == [0, 1], "the test must catch engine 1 mid-export"
    assert busy == {0, 1}
    assert 1 in released


class SliceClock:
    """One second per slice of the engine that ticks it: lives in whole slices."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


class TickingEngine(FakeEngine):
    def __init__(self, index: int, clock: SliceClock) -> None:
        super().__init__(index)
        self.clock = clock

    async def run_rollout(self, max_s: float) -> list[Completion]:
        self.clock.t += 1.0
        return await super().run_rollout(max_s)


def test_a_request_lives_from_its_first_submission_to_its_completion() -> None:
    """One engine, two slots, one token a slice: queued requests start their lives when they
    reach the engine, not when the run starts, so every request (and the tail) makes one
    token a second; the tail is the longest quarter."""
    async def main() -> RolloutRun:
        clock = SliceClock()
        run = RolloutRun(clock, specs(8), RunSettings(0, 2, 1.0), on_completions=lambda c: None)
        run.add_devices([TickingEngine(0, clock)])
        await run.wait()
        return run

    run = asyncio.run(main())
    lives = {key: (tokens, life_s) for tokens, key, life_s in run.progress.lives.lives}
    assert len(lives) == 8
    assert all(life_s == tokens for tokens, life_s in lives.values())
    assert run.progress.lives.tail_tokens_per_s() == 1.0


def test_work_handed_back_beyond_the_engines_slots_makes_the_run_not_drained() -> None:
    # a deep resize hands a stopped engine's requests back; the one engine left is full, so
    # they wait in the queue: the pool must see the run as not drained (engines freed by other
    # runs go to it, `EnginePool._destination`)
    async def main() -> list[bool]:
        engines = [FakeEngine(i) for i in range(2)]
        run = RolloutRun(RealClock(), specs(8), RunSettings(0, 4, 1.0),
                         on_completions=lambda c: None)
        run.add_devices(engines)
        seen = [run.drained.is_set()]  # all 8 running on 2 engines of 4 slots
        await run.stop_admission(engines[1])
        run.requeue(engines[1], await engines[1].export_inflight())
        seen.append(run.drained.is_set())  # 4 wait for engine 0's slots
        await run.wait()
        seen.append(run.drained.is_set())
        return seen

    assert asyncio.run(main()) == [True, False, True]


class SlowDying(FakeEngine):
    """Its first run_rollout returns only once `release` is set (a result in transit)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def run_rollout(self, max_s: float, until_empty: bool = False):
        self.entered.set()
        await self.release.wait()
        return await super().run_rollout(max_s)


def test_a_dropped_device_result_in_transit_is_not_counted_twice() -> None:
    # recovery fences a device while its run_rollout call is awaited: its requests rerun on
    # another engine, and the result that arrives later must not complete them twice
    async def main():
        dying, healthy = SlowDying(0), FakeEngine(1)
        reqs = [s for s in specs(8) if s.max_new_tokens == 1][:2]
        run = RolloutRun(RealClock(), reqs, RunSettings(0, 4, 1.0), on_completions=lambda c: None,
                         on_device_lost=lambda device, exc: True)
        run.add_devices([dying])
        await dying.entered.wait()
        run.add_devices([healthy])
        run.drop_lost(dying, RuntimeError("device 0 died"))   # its requests rerun on 1
        await asyncio.sleep(0.05)
        dying.release.set()                                     # the old result arrives
        await asyncio.wait_for(run.wait(), 5)
        return run, reqs

    run, reqs = asyncio.run(main())
    keys = [c.spec.key for c in run.progress.completions]
    assert sorted(keys) == sorted(r.key for r in reqs), keys
    assert run.progress.remaining == 0, run.progress.remaining
