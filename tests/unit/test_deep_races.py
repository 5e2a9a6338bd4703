"""Races of the pipelined rollout at staleness >= 2 (virtual time): resizes that take engines
where they are, weight loads that outlast them, a tail's rescue, recovery bringing engines
back. Every run must write the records of its fault-free fixed split (design §2) and leave no
engine in two runs or a trainer in a run."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from dynaresize.control.base import Controller, Move, RunView
from dynaresize.control.fixed import FixedSplit
from dynaresize.orchestrator.engine_hooks import ResizeHooks
from dynaresize.orchestrator.engine_pool import EnginePool
from dynaresize.orchestrator.engine_rescue import EngineRescue
from dynaresize.orchestrator.orchestrator import Orchestrator
from dynaresize.resize.executor import ResizeExecutor
from dynaresize.rollout.run import RolloutRun
from dynaresize.rollout.slots import SlotTable
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import run_config, sim_config
from dynaresize.sim.workloads import get_workload

WORKLOAD = get_workload("dapo-7b", seed=2, requests_per_step=256)


def records(out: Path) -> list[tuple[Any, ...]]:
    rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    return sorted((r["step"], r["prompt"], r["sample"], r["version"], r["tokens_sha256"])
                  for r in rows)


class Watch:
    """Spies on the run (observing only): engines added to a run while another holds them
    or while they are trainers, slots replaced while live, devices a resize picks twice."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.orchestrator: Orchestrator | None = None
        self.problems: list[tuple[Any, ...]] = []
        init, add, slot_add = Orchestrator.__init__, RolloutRun.add_devices, SlotTable.add
        movable = ResizeHooks.movable_to_train

        def orch_init(orch: Orchestrator, *a: Any, **k: Any) -> None:
            init(orch, *a, **k)
            self.orchestrator = orch

        def add_devices(run: RolloutRun, devices: Any) -> None:
            o = self.orchestrator
            for d in devices if o is not None else []:
                pool = o.engines
                others = [r for r in (pool.run, *pool.tails) if r is not None and r is not run]
                if any(d.index in r.held_devices() for r in others):
                    self.problems.append(("in two runs", d.index, run.version))
                if d.index in o.state.allocation.train \
                        and d.index not in pool.transit.serving_early:
                    self.problems.append(("trainer in a run", d.index, run.version))
            add(run, devices)

        def table_add(table: SlotTable, device: Any) -> Any:
            if table.get(device.index) is not None:
                self.problems.append(("live slot replaced", device.index))
            return slot_add(table, device)

        def movable_to_train(hooks: ResizeHooks, num: int) -> Any:
            picks = movable(hooks, num)
            if picks is not None and len(set(picks)) != len(picks):
                self.problems.append(("picked twice", picks))
            return picks

        monkeypatch.setattr(Orchestrator, "__init__", orch_init)
        monkeypatch.setattr(RolloutRun, "add_devices", add_devices)
        monkeypatch.setattr(SlotTable, "add", table_add)
        monkeypatch.setattr(ResizeHooks, "movable_to_train", movable_to_train)

    def pool(self) -> EnginePool:
        assert self.orchestrator is not None
        return self.orchestrator.engines


class RandomMoves(Controller):
    """Seeded random moves at step start, during the rollout and at its end."""

    streams_training = True

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.needs_progress = seed % 2 == 0

    def _moves(self, view: RunView, p: float, blocking_ok: bool) -> list[Move]:
        rng, alloc = self.rng, view.allocation
        if rng.random() > p:
            return []
        if rng.random() < 0.5 and len(alloc.rollout) > 1:
            return [Move("rollout->train", rng.randint(1, len(alloc.rollout) - 1),
                         blocking=blocking_ok and rng.random() < 0.2,
                         idle_first=rng.random() < 0.5)]
        if len(alloc.train) > 1:
            return [Move("train->rollout", rng.randint(1, len(alloc.train) - 1),
                         blocking=blocking_ok and rng.random() < 0.2)]
        return []

    def at_step_start(self, view: RunView) -> list[Move]:
        return self._moves(view, 0.6, True)

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        return self._moves(view, 0.01, False)

    def at_rollout_end(self, view: RunView) -> list[Move]:
        return self._moves(view, 0.3, False)


class MoveAt(Controller):
    """One move at the start of step `step` (or once half of its rollout finished)."""

    streams_training = True

    def __init__(self, step: int, move: str, num: int, in_rollout: bool = False) -> None:
        self.step, self.move, self.num, self.needs_progress = step, move, num, in_rollout
        self.done = False

    def _once(self, view: RunView) -> list[Move]:
        if view.step != self.step or self.done:
            return []
        self.done = True
        return [Move(self.move, self.num)]

    def at_step_start(self, view: RunView) -> list[Move]:
        return [] if self.needs_progress else self._once(view)

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        half = view.rollout_total and view.rollout_finished > view.rollout_total / 2
        return self._once(view) if half else []

    def at_rollout_end(self, view: RunView) -> list[Move]:
        return []


def run(tmp: Path, name: str, controller: Controller, split: tuple[int, int], steps: int,
        staleness: int, chaos: Any = None, **costs: float) -> Path:
    cost_model = get_cost_model("h100-7b", **costs)
    cfg = sim_config(WORKLOAD, split[0], split[1], steps, staleness, 0, cost_model)
    out = tmp / name
    run_config(cfg, WORKLOAD, cost_model, controller=controller, out_dir=out, chaos=chaos)
    return out


@pytest.mark.parametrize("staleness,seed", [(2, 4), (2, 6), (3, 1)])
def test_random_moves_with_slow_weight_loads_keep_the_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staleness: int, seed: int) -> None:
    # weight loads of ~8 s: resizes start and commit while a new step's engines load
    slow = {"weight_sync_bytes_per_s": 2e9}
    reference = run(tmp_path, "fixed", FixedSplit(), (5, 3), 7, staleness, **slow)
    watch = Watch(monkeypatch)
    out = run(tmp_path, "moves", RandomMoves(seed), (5, 3), 7, staleness, **slow)
    assert records(out) == records(reference)
    assert not watch.problems
    transit = watch.pool().transit
    assert not transit.leaving and not transit.serving_early


@pytest.mark.parametrize("sync_bytes_per_s", [1e8, 5e7])
def test_a_resize_taking_an_engine_that_loads_keeps_it_out_of_the_new_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_bytes_per_s: float) -> None:
    # the step-start move takes a free engine while it loads step 3's version, and commits
    # first: the engine is a trainer when the load returns (it used to join the run)
    costs = {"weight_sync_bytes_per_s": sync_bytes_per_s, "train_mfu": 0.1}
    reference = run(tmp_path, "fixed", FixedSplit(), (6, 2), 6, 2, **costs)
    watch = Watch(monkeypatch)
    out = run(tmp_path, "move", MoveAt(3, "rollout->train", 1), (6, 2), 6, 2, **costs)
    assert records(out) == records(reference)
    assert not watch.problems


def test_a_move_counts_the_newest_run_once(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # between `keep_tail` and the next run the newest run is the newest tail too: a move of 4
    # used to pick its devices twice and move 2
    watch = Watch(monkeypatch)
    out = run(tmp_path, "move", MoveAt(3, "rollout->train", 4, in_rollout=True), (6, 2), 8, 2,
              train_mfu=0.4)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["num_rollout_devices"] == 2
    assert not watch.problems


def test_a_rolled_back_resize_leaves_no_engine_leaving(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    init = ResizeExecutor.__init__

    def failing(executor: ResizeExecutor, *a: Any, **k: Any) -> None:
        init(executor, *a, **k)
        executor.fail = lambda index, op: index == 0 and op.kind == "start_serving"

    monkeypatch.setattr(ResizeExecutor, "__init__", failing)
    watch = Watch(monkeypatch)
    run(tmp_path, "rollback", MoveAt(3, "train->rollout", 1), (4, 4), 6, 2)
    pool = watch.pool()
    assert not pool.transit.leaving and not pool.transit.serving_early
    assert pool.num_rollout_devices() == len(pool.rollout_devices()) == 4


class KillTailEngine:
    """Kills the engines of a tail once it has at most 2 left with requests to go (the
    rescue borrows one of the newest run's); with `donor`, that donor 0.1 s later. Loads of
    an older version than the newest run's take `slow_load_s` more (the rescue's load)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, watch: Watch, donor: bool,
                 slow_load_s: float) -> None:
        self.watch, self.donor, self.slow_load_s = watch, donor, slow_load_s
        self.killed: list[int] = []
        self.processes: Any = None
        hand_off, rescue = EnginePool.hand_off_tail, EngineRescue.rescue_tail
        started: list[Any] = []

        def hand_off_tail(pool: EnginePool) -> None:
            hand_off(pool)
            if not started:
                started.append(asyncio.ensure_future(self.poll(pool)))

        def rescue_tail(engine_rescue: EngineRescue, tail: RolloutRun, version: int,
                        lost: int) -> None:
            rescue(engine_rescue, tail, version, lost)
            pool = self.watch.pool()
            if self.donor and pool.run is not None and pool.run.devices():
                asyncio.get_running_loop().call_later(0.1, self.processes.kill,
                                                      pool.run.devices()[-1])

        monkeypatch.setattr(EnginePool, "hand_off_tail", hand_off_tail)
        monkeypatch.setattr(EngineRescue, "rescue_tail", rescue_tail)

    def chaos(self, devices: list[Any], processes: Any) -> None:
        self.processes = processes
        for device in devices:
            device.load_weights = self._slowed(device.load_weights)

    def _slowed(self, load: Any) -> Any:
        async def slow(version: int, handle: Any) -> Any:
            pool = self.watch.pool()
            if self.slow_load_s and pool.run is not None and version < pool.run.version:
                await pool.clock.sleep(self.slow_load_s)
            return await load(version, handle)
        return slow

    async def poll(self, pool: EnginePool) -> None:
        clock = pool.clock
        while not self.killed:
            await clock.sleep(0.5)
            if clock.now() < 300:
                continue
            for tail in pool.tails[1:]:
                if 0 < len(tail.devices()) <= 2 and tail.progress.remaining > 0:
                    self.killed.extend(tail.devices())
                    for index in tail.devices():
                        self.processes.kill(index)
                    return


@pytest.mark.parametrize("donor_dies", [False, True])
def test_a_tail_rescue_with_a_slow_load_keeps_its_donor_in_one_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, donor_dies: bool) -> None:
    costs = {"weight_sync_bytes_per_s": 1e10 if donor_dies else 1e9}
    reference = run(tmp_path, "fixed", FixedSplit(), (8, 2), 8, 2, **costs)
    watch = Watch(monkeypatch)
    kill = KillTailEngine(monkeypatch, watch, donor_dies, 0.0 if donor_dies else 20.0)
    out = run(tmp_path, "rescue", FixedSplit(), (8, 2), 8, 2, chaos=kill.chaos, **costs)
    assert kill.killed
    assert records(out) == records(reference)
    assert not watch.problems


def test_recovery_does_not_serve_an_engine_a_deep_resize_is_taking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a rollout engine dies at step 3's start; the move then marks engines leaving and
    # repairs first: the repair used to start them serving again, over their live slots
    processes: list[Any] = []

    class KillThenMove(MoveAt):
        def at_step_start(self, view: RunView) -> list[Move]:
            if view.step == self.step and not self.done:
                processes[0].kill(0)
            return self._once(view)

    reference = run(tmp_path, "fixed", FixedSplit(), (12, 2), 7, 2)
    watch = Watch(monkeypatch)
    out = run(tmp_path, "kill", KillThenMove(3, "rollout->train", 2), (12, 2), 7, 2,
              chaos=lambda devices, procs: processes.append(procs))
    assert records(out) == records(reference)
    assert not watch.problems
