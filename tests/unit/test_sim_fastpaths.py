"""The twin's fast paths change cost, not results: bulk dispatch, bounded progress reports,
`borrow`'s `needs_progress`, `VirtualClock.after`, lazily built sample records, and a golden
for a KV-bound cost model (recompute preemption on every engine)."""

from __future__ import annotations

import asyncio
import random
from collections import deque

import pytest

from dynaresize.control.borrow import BorrowController
from dynaresize.control.registry import POLICIES
from dynaresize.core.rundir import RunDir
from dynaresize.core.samples import Records, _sha, assemble_step
from dynaresize.core.types import Completion, RequestSpec, tokens_sha256
from dynaresize.rollout import run_settings
from dynaresize.rollout.run import RolloutRun, RunSettings
from dynaresize.rollout.slots import SlotTable
from dynaresize.sim.clock import VirtualClock
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.device import SimCompletion, make_devices
from dynaresize.sim.run import simulate
from dynaresize.sim.workloads import get_workload


class _Dev:
    def __init__(self, index: int) -> None:
        self.index = index


def _random_table(rng: random.Random) -> tuple[SlotTable, deque, int]:
    """Slots with random loads (some leaving) and stale heap candidates, a random queue."""
    limit = rng.randint(1, 9)
    table = SlotTable()
    for index in rng.sample(range(40), rng.randint(1, 14)):
        slot = table.add(_Dev(index))  # type: ignore[arg-type]
        for _ in range(rng.randint(0, limit)):
            slot.give(f"old{index}")  # type: ignore[arg-type]
        if rng.random() < 0.2:
            slot.leave()
        if slot.load < limit:
            table.freed(slot)
    slots = list(table)
    for _ in range(rng.randint(0, 6)):  # stale candidates, as completions and dispatch leave
        table.freed(rng.choice(slots))
    return table, deque(range(rng.randint(0, 150))), limit


def _view(table: SlotTable) -> dict[int, tuple[int, list]]:
    return {s.index: (s.load, list(s.pending)) for s in table}


def test_bulk_dispatch_is_the_one_by_one_greedy() -> None:
    for seed in range(2000):
        (a, qa, limit), (b, qb, _) = (_random_table(random.Random(seed)),
                                      _random_table(random.Random(seed)))
        a.deal_greedy(qa, limit, lambda i, q=qa: q.popleft())
        b.deal_bulk(qb, limit, lambda i, q=qb: q.popleft())
        assert _view(a) == _view(b), seed
        assert list(qa) == list(qb), seed
        assert all(s.wake.is_set() for s in b if len(s.pending) > 1), seed
        # the rebuilt candidate heap picks what the one-by-one path's heap picks next
        qa.extend(range(1000, 1000 + 5 * limit))
        qb.extend(range(1000, 1000 + 5 * limit))
        a.deal_greedy(qa, limit, lambda i, q=qa: q.popleft())
        b.deal_greedy(qb, limit, lambda i, q=qb: q.popleft())
        assert _view(a) == _view(b) and list(qa) == list(qb), seed


def _rollout(num_requests: int, num_devices: int) -> tuple[list[list[Completion]], int]:
    """Run one step's requests on SimDevices with progress watched; returns the reports and
    the number of device returns that carried completions."""
    wl = get_workload("dapo-7b", requests_per_step=num_requests)
    costs = get_cost_model("h100-7b")
    clock = VirtualClock()
    devices = make_devices(num_devices, num_devices, costs, wl, clock)
    returns = [0]
    for d in devices:
        inner = d.run_rollout

        async def counted(max_s: float, until_empty: bool = False, inner=inner) -> list:
            out = await inner(max_s, until_empty)
            returns[0] += bool(out)
            return out

        d.run_rollout = counted  # type: ignore[method-assign]
    specs = [RequestSpec(0, p, j, 0, (1,), wl.max_response_tokens, 0)
             for p in range(wl.prompts_per_step) for j in range(wl.samples_per_prompt)]
    reports: list[list[Completion]] = []

    async def main() -> RolloutRun:
        run = RolloutRun(clock, specs, RunSettings(0, 256, 30.0),
                         lambda done: reports.append(list(done)),
                         drain=lambda: False)
        run.add_devices(devices)
        await run.wait()
        return run

    run = clock.run(main())
    assert sorted(c.spec.key for r in reports for c in r) == sorted(s.key for s in specs)
    assert sum(map(len, reports)) == len(run.progress.completions) == run.progress.total
    return reports, returns[0]


def test_progress_is_reported_at_bounded_granularity() -> None:
    reports, returns = _rollout(4096, 16)  # every request in flight at once
    assert len(reports) < returns / 3
    remaining = 4096
    for batch in reports[:-1]:
        assert len(batch) >= run_settings.PROGRESS_FRACTION * remaining  # nothing queued here
        remaining -= len(batch)


def test_small_runs_report_every_device_return() -> None:
    reports, returns = _rollout(96, 4)  # at most 100 in flight: one report per return
    assert len(reports) == returns


@pytest.mark.parametrize("staleness", [0, 1])
def test_borrow_skipping_progress_changes_nothing(staleness: int) -> None:
    class AlwaysWatching(BorrowController):
        needs_progress = True  # type: ignore[assignment]

    POLICIES["borrow-watching"] = lambda cfg: AlwaysWatching()
    try:
        args = {"gpus": 12, "steps": 4, "requests_per_step": 96, "seed": 3,
                "staleness": staleness, "split": 8}
        fast = simulate("dapo-7b", policies=("borrow",), **args)["results"][0]
        slow = simulate("dapo-7b", policies=("borrow-watching",), **args)["results"][0]
    finally:
        del POLICIES["borrow-watching"]
    slow["policy"] = "borrow"
    assert fast == slow and fast["num_resizes"] > 0


def test_after_wakes_like_sleep() -> None:
    clock = VirtualClock()
    order: list[tuple[str, int, float]] = []

    async def worker(kind: str, i: int) -> None:
        rng = random.Random(i)
        for _ in range(20):
            delay = rng.choice([0.0, 0.5, 1.0, rng.random()])
            await (clock.after(delay) if kind == "after" else clock.sleep(delay))
            order.append((kind, i, clock.now()))

    async def main(kind: str) -> None:
        await asyncio.gather(*(worker(kind, i) for i in range(12)))

    clock.run(main("after"))
    by_after = [(i, t) for _, i, t in order]
    order.clear()
    clock = VirtualClock()
    clock.run(main("sleep"))
    assert by_after == [(i, t) for _, i, t in order]


def test_records_are_built_on_demand_and_equal_the_eager_ones() -> None:
    specs = [RequestSpec(2, p, j, 1, (7,), 100, 0) for p in range(3) for j in range(4)]
    comps: list[Completion] = [SimCompletion(s, [10 + 7 * s.prompt + s.sample], [], "eos", 5, 1,
                                             10 + 7 * s.prompt + s.sample) for s in specs]
    comps.append(Completion(RequestSpec(2, 3, 0, 1, (7,), 100, 0), list(range(9)), [0.0] * 9,
                            "length", 6, 1))
    comps += [Completion(RequestSpec(2, 3, j, 1, (7,), 100, 0), [1, 2], [0.0] * 2, "eos", 6, 1)
              for j in range(1, 4)]
    rewards = {(c.spec.prompt, c.spec.sample): float(c.spec.sample % 2) for c in comps}
    random.Random(0).shuffle(comps)
    got = assemble_step(2, 1, set(rewards), comps, rewards, 1.0, record_tokens=True)
    assert isinstance(got.records, Records) and len(got.records) == 16
    rundir = RunDir(None)
    rundir.samples(got.records)
    assert rundir.num_samples == 16 and got.records._records is None  # not built
    eager = []
    for s in got.samples:
        c = next(c for c in comps if (c.spec.prompt, c.spec.sample) == (s.prompt, s.sample))
        eager.append({"step": 2, "prompt": s.prompt, "sample": s.sample, "version": 1,
                      "device": c.device, "response_tokens": c.num_tokens,
                      "tokens_sha256": tokens_sha256(list(c.tokens)),
                      "reward": round(rewards[(s.prompt, s.sample)], 6),
                      "finish_reason": c.finish_reason, "tokens": list(c.tokens)})
    assert got.records == eager and list(got.records) == eager and got.records[3] == eager[3]
    assert _sha([5]) == tokens_sha256([5]) and _sha(list(range(9))) == tokens_sha256(
        list(range(9)))


KV_BOUND_GOLDEN = {
    # dapo-7b on h100-32b (24k KV tokens per engine: ~14k recompute preemptions), 6 GPUs,
    # 256 requests, 3 steps, seed 1: policy -> (split, mean_step_s)
    1: {"static": ((4, 2), 1503.1018), "colocated": ((6, 6), 1223.968)},
    0: {"static": ((4, 2), 1754.4789), "colocated": ((6, 6), 1223.968)},
}


@pytest.mark.parametrize("staleness", sorted(KV_BOUND_GOLDEN))
def test_kv_bound_golden(staleness: int) -> None:
    out = simulate("dapo-7b", gpus=6, steps=3, requests_per_step=256, seed=1,
                   cost_model="h100-32b", staleness=staleness, policies=("static", "colocated"))
    got = {r["policy"]: ((r["split"]["rollout"], r["split"]["train"]),
                         round(r["mean_step_s"], 4)) for r in out["results"]}
    assert got == KV_BOUND_GOLDEN[staleness]


def test_callback_errors_reach_the_exception_handler() -> None:
    """The loop's inlined `Handle._run` reports a failing callback as asyncio does."""
    seen: list[dict] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: seen.append(context))
        loop.call_soon(lambda: 1 / 0)
        await loop.clock.sleep(1.0)  # type: ignore[attr-defined]
        assert loop.get_debug() is False
        loop.set_debug(True)
        assert loop.get_debug() is True
        loop.set_debug(False)

    VirtualClock().run(main())
    assert len(seen) == 1 and isinstance(seen[0]["exception"], ZeroDivisionError)
    assert seen[0]["message"].startswith("Exception in callback")


def test_a_request_larger_than_the_kv_cache_is_refused_not_spun() -> None:
    """Regression: a request whose context cannot fit one device's KV cache was preempted and
    re-admitted forever (memory grew until the machine ran out). Now: a clear error."""
    import pytest

    from dynaresize.sim.run import simulate

    with pytest.raises(ValueError, match="KV-cache tokens"):
        simulate("agentic", 8, ("static",), steps=1, staleness=1, seed=0,
                 cost_model="h100-32b", split=4)
