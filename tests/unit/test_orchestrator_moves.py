"""Controller moves that do not block the step (the hysteresis style), in the twin: however
they interleave with the rollout and the train step, every sample keeps its fixed version
(the orchestrator's own §2.1/§2.2 checks raise otherwise) and the allocation ends right."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest

from dynaresize.control.base import Move, RunView
from dynaresize.control.fixed import FixedSplit
from dynaresize.orchestrator.background import Background
from dynaresize.orchestrator.engine_hooks import ResizeHooks
from dynaresize.orchestrator.engine_pool import EnginePool
from dynaresize.orchestrator.engine_rescue import EngineRescue
from dynaresize.orchestrator.engine_transit import EngineTransit
from dynaresize.orchestrator.engine_versions import EngineVersions
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import run_config, sim_config
from dynaresize.sim.workloads import get_workload


class Alternate:
    """Every step start: move one device, alternating direction (non-blocking)."""

    needs_progress = True
    streams_training = False

    def __init__(self, mid_rollout: bool) -> None:
        self.mid_rollout = mid_rollout
        self.fired: set[int] = set()

    def _move(self, step: int) -> list[Move]:
        direction = "rollout->train" if step % 2 else "train->rollout"
        return [Move(direction, 1)]

    def at_step_start(self, view: RunView) -> list[Move]:
        return [] if self.mid_rollout or view.step == 0 else self._move(view.step)

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        if not self.mid_rollout or view.step in self.fired or view.step == 0:
            return []
        if view.rollout_finished < view.rollout_total // 3:
            return []
        self.fired.add(view.step)
        return self._move(view.step)

    def at_rollout_end(self, view: RunView) -> list[Move]:
        return []


@pytest.mark.parametrize("staleness", [0, 1])
@pytest.mark.parametrize("mid_rollout", [False, True])
def test_non_blocking_moves_keep_versions(staleness: int, mid_rollout: bool) -> None:
    workload = get_workload("dapo-7b", seed=3, requests_per_step=64)
    costs = get_cost_model("h100-7b")
    cfg = sim_config(workload, 3, 3, 7, staleness, 0, costs)
    run = run_config(cfg, workload, costs, controller=Alternate(mid_rollout))
    assert run.summary["steps"] == 7
    assert run.summary["num_resizes"] == 6      # one per step after the first, both ways
    metrics = run.rundir.metrics
    assert [m["policy_version"] for m in metrics] == [max(0, k - staleness) for k in range(7)]
    assert (metrics[-1]["num_rollout_devices"], metrics[-1]["num_train_devices"]) == (3, 3)


def test_device_stopped_between_steps_gets_no_rollout_work() -> None:
    """Regression (found by the twin): at staleness 1 with training the bottleneck, a
    rollout->train move decided at a step start took the optimizer-step boundary before the
    step's rollout existed; the device was still handed that rollout's requests and, once a
    trainer, finished one with the next version. Every sample must keep its version."""
    from dynaresize.control.hysteresis.controller import HysteresisController, HysteresisParams

    workload = get_workload("drift", seed=0, requests_per_step=2048)
    costs = get_cost_model("h100-7b")
    cfg = sim_config(workload, 26, 6, 12, 1, 0, costs)
    cfg.train.max_tokens_per_micro_batch = 0  # the training load the regression was found at
    controller = HysteresisController(HysteresisParams(band=0.0, min_dwell_steps=1,
                                                       cost_margin=0.0))
    controller.streams_training = False  # the split moves this regression needs
    run = run_config(cfg, workload, costs, controller=controller)
    assert run.summary["num_resizes"] >= 2
    assert [m["policy_version"] for m in run.rundir.metrics] == [max(0, k - 1)
                                                                for k in range(12)]


class StreamingAlternate(Alternate):
    streams_training = True


@pytest.mark.parametrize(("staleness", "pipelined"), [(0, False), (1, False), (1, True)])
def test_streaming_training_accumulates_every_micro_batch_once(
        staleness: int, pipelined: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With training streamed over completed groups and devices moving mid-rollout both
    ways, every step's optimizer step combines each micro-batch exactly once, held by a
    device of the final training group (what a departed device held was recomputed). With
    pipelined rollouts a step's moves are decided only while it is the newest step, and a
    resize waits until one step rolls out, so fewer of them fire."""
    from dynaresize.sim.device import SimDevice

    held: dict[int, dict[int, int]] = {}
    finished: dict[int, list[tuple[int, ...]]] = {}
    orig_acc, orig_fin = SimDevice.train_accumulate, SimDevice.train_finish

    async def acc(self, step, micro_batches):  # type: ignore[no-untyped-def]
        for m, mb in micro_batches:
            assert mb and all(s.step == step for s in mb)
            held.setdefault(step, {})[m] = self.index
        await orig_acc(self, step, micro_batches)

    async def fin(self, step, num_micro_batches, global_num_tokens):  # type: ignore[no-untyped-def]
        finished.setdefault(step, []).append((self.index, num_micro_batches))
        return await orig_fin(self, step, num_micro_batches, global_num_tokens)

    monkeypatch.setattr(SimDevice, "train_accumulate", acc)
    monkeypatch.setattr(SimDevice, "train_finish", fin)
    workload = get_workload("dapo-7b", seed=5, requests_per_step=64)
    costs = get_cost_model("h100-7b")
    cfg = sim_config(workload, 3, 3, 6, staleness, 0, costs)
    cfg.controller.pipeline_rollouts = pipelined
    cfg.train.max_tokens_per_micro_batch = 0  # count micro-batches (0..M-1, no empty slots)
    run = run_config(cfg, workload, costs, controller=StreamingAlternate(True))
    assert run.orchestrator is not None and run.orchestrator.streaming
    assert run.orchestrator.pipelined == pipelined
    assert run.summary["steps"] == 6
    assert run.summary["num_resizes"] == 5 if not pipelined else run.summary["num_resizes"] >= 2
    num_mbs = 64 // cfg.train.micro_batch_size
    for step in range(6):
        finishers = {d for d, _ in finished[step]}
        assert {n for _, n in finished[step]} == {num_mbs}
        assert sorted(held[step]) == list(range(num_mbs))
        # the last holder of every micro-batch took part in that step's optimizer step
        assert set(held[step].values()) <= finishers


StreamingStatic = FixedSplit
"""Streams training, never moves a device (the `fixed` policy)."""


def test_pipelined_rollouts_overlap_steps_and_keep_every_sample(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Staleness 1: step k + 1's rollout starts on engines step k's tail emptied or packed
    (requests migrated), and the sample records (step, prompt, sample, version, tokens)
    equal the unpipelined run's."""
    import json

    workload = get_workload("dapo-7b", seed=2, requests_per_step=512)
    costs = get_cost_model("h100-7b")
    got = {}
    for pipelined in (False, True):
        cfg = sim_config(workload, 3, 3, 5, 1, 0, costs)
        cfg.controller.pipeline_rollouts = pipelined
        out = tmp_path / str(pipelined)
        run = run_config(cfg, workload, costs, controller=StreamingStatic(), out_dir=out)
        assert run.orchestrator is not None and run.orchestrator.pipelined == pipelined
        records = sorted((r["step"], r["prompt"], r["sample"], r["version"], r["tokens_sha256"])
                         for r in map(json.loads, open(out / "samples.jsonl")))
        spans: dict[int, list[float]] = {}
        for e in map(json.loads, open(out / "events.jsonl")):
            if e["kind"] == "rollout":
                span = spans.setdefault(e["step"], [e["t_start"], e["t_end"]])
                span[0], span[1] = min(span[0], e["t_start"]), max(span[1], e["t_end"])
        overlaps = sum(spans[k + 1][0] < spans[k][1] for k in range(4))
        got[pipelined] = (records, overlaps, run.summary["wall_s"])
        assert (run.orchestrator.rollout.num_migrated > 0) == pipelined  # packing moved requests
    assert got[True][0] == got[False][0] and len(got[True][0]) == 5 * 512
    assert got[False][1] == 0 and got[True][1] >= 2
    assert got[True][2] <= got[False][2]


class _DeathsOnly:
    """Recovery stand-in: a rollout device that raises is gone (fenced); nothing else dies."""

    enabled = True
    num_repairs = 0

    def __init__(self, faults, state, engines, hooks, fence, stepper,  # type: ignore
                 clock, rundir, **callbacks) -> None:
        self.fence = fence

    def on_rollout_lost(self, device, exc) -> bool:  # type: ignore[no-untyped-def]
        self.fence(device.index)
        return True

    def find_dead(self, how: str) -> bool:
        return False

    async def repair(self) -> None:
        return None

    def retain(self, step, got) -> None:  # type: ignore[no-untyped-def]
        return None


def test_pipelined_tail_whose_last_engine_dies_is_finished_by_the_newest_step(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Pipelined rollouts with recovery: the previous step's last engine dies with requests
    left; an engine of the newest step takes them over (with the previous version) and every
    sample still comes out once, with its step's version."""
    import json

    from dynaresize.sim.device import SimDevice

    workload = get_workload("dapo-7b", seed=2, requests_per_step=256)
    costs = get_cost_model("h100-7b")
    cfg = sim_config(workload, 3, 2, 4, 1, 0, costs)
    killed: list[int] = []
    orch_box: list = []
    orig = SimDevice.run_rollout

    async def run_rollout(self, max_s, until_empty=False):  # type: ignore[no-untyped-def]
        orch = orch_box[0] if orch_box else None
        tail = orch.engines.tail_run if orch is not None else None
        newest = orch.engines.run if orch is not None else None
        if (not killed and tail is not None and tail.devices() == [self.index]
                and tail.progress.remaining and newest is not tail and newest.devices()):
            killed.append(self.index)
            raise RuntimeError("device process died")
        return await orig(self, max_s, until_empty)

    monkeypatch.setattr(SimDevice, "run_rollout", run_rollout)
    from dynaresize.orchestrator import orchestrator as orch_mod
    orig_init = orch_mod.Orchestrator.__init__

    def init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        orig_init(self, *args, **{**kwargs, "faults": SimpleNamespace()})
        orch_box.append(self)

    monkeypatch.setattr(orch_mod, "Recovery", _DeathsOnly)
    monkeypatch.setattr(orch_mod.Orchestrator, "__init__", init)
    out = tmp_path / "run"
    run = run_config(cfg, workload, costs, controller=StreamingStatic(), out_dir=out)
    assert killed and run.orchestrator is not None and run.orchestrator.pipelined
    records = [json.loads(line) for line in open(out / "samples.jsonl")]
    keys = {(r["step"], r["prompt"], r["sample"]) for r in records}
    assert len(records) == len(keys) == 4 * 256
    assert all(r["version"] == max(0, r["step"] - 1) for r in records)
    assert killed[0] not in {r["device"] for r in records if r["step"] >= 2}


def test_pipelined_rollout_error_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device error (no recovery) in a pipelined step, before its queue drained, fails the
    run with that error instead of leaving the loop waiting for the drain."""
    from dynaresize.sim.device import SimDevice

    workload = get_workload("dapo-7b", seed=2, requests_per_step=2048)  # > 2 x 256 slots
    costs = get_cost_model("h100-7b")
    cfg = sim_config(workload, 2, 2, 4, 1, 0, costs)
    orig = SimDevice.run_rollout
    calls = [0]

    async def run_rollout(self, max_s, until_empty=False):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 40:
            raise RuntimeError("engine crashed")
        return await orig(self, max_s, until_empty)

    monkeypatch.setattr(SimDevice, "run_rollout", run_rollout)
    with pytest.raises(RuntimeError, match="engine crashed"):
        run_config(cfg, workload, costs, controller=StreamingStatic())


class LateMove:
    """Moves a device as the last request finishes; records what the rollout end saw."""

    needs_progress = True
    streams_training = False

    def __init__(self) -> None:
        self.fired: set[int] = set()
        self.at_end: list[tuple[int, int]] = []

    def at_step_start(self, view: RunView) -> list[Move]:
        return [Move("train->rollout", 1)] if view.step == 2 else []

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        if view.step != 1 or view.step in self.fired or \
                view.rollout_finished < view.rollout_total:
            return []
        self.fired.add(view.step)
        return [Move("rollout->train", 1)]

    def at_rollout_end(self, view: RunView) -> list[Move]:
        self.at_end.append((view.num_pending_resizes, len(view.allocation.rollout)))
        return []


def test_the_rollout_end_is_decided_on_the_allocation_its_step_left() -> None:
    """A move fired in a step's last moments is applied before `at_rollout_end` is asked
    (it once found the move pending, decided nothing, and lent engines sat idle)."""
    workload = get_workload("dapo-7b", seed=3, requests_per_step=64)
    costs = get_cost_model("h100-7b")
    cfg = sim_config(workload, 3, 3, 3, 0, 0, costs)
    ctl = LateMove()
    run = run_config(cfg, workload, costs, controller=ctl)
    assert run.summary["num_resizes"] == 2
    assert ctl.at_end[1] == (0, 2)        # step 1: the move is done, 2 engines left


class _Run:
    """What the resize hooks and the hand-off read of a `RolloutRun`."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.finished = asyncio.Event()
        self.joined: list[tuple[int, int]] = []   # (device, the version it served on joining)

    def add_devices(self, devices) -> None:  # type: ignore[no-untyped-def]
        self.joined += [(d.index, d.loaded) for d in devices]


class _Device:
    def __init__(self, index: int) -> None:
        self.index = index
        self.loaded = -1

    async def load_weights(self, version: int, handle: object) -> None:
        await asyncio.sleep(0)
        self.loaded = version


def _pool(run: _Run, served_version: int) -> tuple[EnginePool, ResizeHooks]:
    """An engine pool with device 0 in `run` and device 1 a training device, and its resize
    hooks, whose `current_weights` named `served_version` before `run` started (what
    `start_serving` and the move to the newest run use, nothing else)."""
    state = SimpleNamespace(devices=[_Device(0), _Device(1)],
                            allocation=SimpleNamespace(rollout=(0,), train=(1,)),
                            versions=SimpleNamespace(get=lambda version: f"weights v{version}",
                                                     latest=served_version,
                                                     has=lambda version: True),
                            rollout_version=served_version)
    background = Background()
    background.start()
    clock = SimpleNamespace(now=lambda: 0.0)
    versions = EngineVersions((0, 1), clock,  # type: ignore[arg-type]
                              SimpleNamespace(event=lambda *args, **kwargs: None))
    transit = EngineTransit()
    pool = EnginePool(state, clock, background, versions, transit)  # type: ignore[arg-type]
    rescue = EngineRescue(pool, transit, state, versions, clock,  # type: ignore[arg-type]
                          background)
    hooks = ResizeHooks(pool, transit, state, versions, rescue)  # type: ignore[arg-type]
    assert hooks.current_weights((1,))[0] == served_version  # no step rolls out yet
    pool.start_run(run)  # type: ignore[arg-type]
    versions.set_loaded(0, run.version)
    versions.gone(1)
    return pool, hooks


@pytest.mark.parametrize("served_version", [4, 5])
def test_device_joining_mid_resize_serves_the_running_steps_version(served_version: int) -> None:
    """Regression (found by the twin, 64 GPUs at staleness 1): a train->rollout resize loaded
    the weights `current_weights` named while no step rolled out (version 4, the step that had
    just ended), the rollout loop then started the next step (version 5), and `start_serving`
    put the device in that step's run as it was: step 6's samples came out of version 4. A
    device that serves another version than the running step's now loads it first."""

    async def scenario() -> tuple[list[tuple[int, int]], int]:
        run = _Run(version=5)
        pool, hooks = _pool(run, served_version)
        device = pool.state.devices[1]
        device.loaded = served_version               # what the resize loaded on it
        hooks.start_serving(device)
        await pool.settle()                          # the device is on its way, if at all
        return run.joined, pool.versions.of(1)

    joined, engine_version = asyncio.run(scenario())
    assert joined == [(1, 5)] and engine_version == 5


class RandomMoves:
    """Streaming (so pipelined at staleness 1); moves devices at random, both ways, at step
    start (some blocking), during the rollout (some idle-first) and at rollout end."""

    streams_training = True
    needs_progress = True

    def __init__(self, seed: int, rate: float) -> None:
        self.rng = random.Random(seed)
        self.rate = rate

    def _maybe(self, view: RunView) -> list[Move]:
        r, t = len(view.allocation.rollout), len(view.allocation.train)
        if self.rng.random() > self.rate:
            return []
        if self.rng.random() < 0.5 and r > 1:
            return [Move("rollout->train", self.rng.randint(1, r - 1),
                         self.rng.random() < 0.2, self.rng.random() < 0.3)]
        if t > 1:
            return [Move("train->rollout", self.rng.randint(1, t - 1), self.rng.random() < 0.2)]
        return []

    def at_step_start(self, view: RunView) -> list[Move]:
        return self._maybe(view)

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        return self._maybe(view) if self.rng.random() < 0.2 else []

    def at_rollout_end(self, view: RunView) -> list[Move]:
        return self._maybe(view)


@pytest.mark.parametrize(("seed", "steps"), [(12, 6), (17, 6), (33, 6), (82, 6), (5, 6),
                                           (40, 6), (77, 6), (1026, 10), (1258, 10)])
def test_random_moves_keep_versions_and_finish(seed: int, steps: int) -> None:
    """Any sequence of legal moves leaves a run that finishes with every sample at its
    version. Regressions (found by this test with random seeds, staleness 1, pipelined):
    seeds 12/17/33 — a blocking move at a step start loaded the previous step's version,
    already dropped from the store (KeyError); seed 82 — the previous step's last tail
    engines were freed while the next step's weights loaded and joined no run, the others
    then moved to training, and the run waited forever for an engine; seeds 1026/1258 (10
    steps, tail packing on) — a move fired in a step finished after its run, once training
    had published two more versions: it loaded the dropped one."""
    rng = random.Random(seed)
    name = rng.choice(["dapo-7b", "agentic", "balanced", "drift"])
    gpus = rng.choice([4, 6, 8, 12, 16])
    num_rollout, staleness = rng.randint(1, gpus - 1), rng.choice([0, 1])
    requests = rng.choice([32, 64, 128, 256])
    if requests % get_workload(name).samples_per_prompt:
        requests = 64
    workload = get_workload(name, seed=seed, requests_per_step=requests)
    costs = get_cost_model("h100-7b")
    cfg = sim_config(workload, num_rollout, gpus - num_rollout, steps, staleness, 0, costs)
    if steps > 6:
        cfg.rollout.pack_batch = rng.choice([0, 2, 8, 32])
    run = run_config(cfg, workload, costs, controller=RandomMoves(seed, rng.choice([0.3, 0.7])))
    assert run.summary["steps"] == steps
    assert [m["policy_version"] for m in run.rundir.metrics] == [max(0, k - staleness)
                                                                for k in range(steps)]


def test_devices_of_one_resize_join_with_the_version_each_loaded() -> None:
    """Two train->rollout devices of one resize call `current_weights` at different times: a
    new step's run (version 5) started in between. Each joins with the version it loaded:
    device 1 (version 4, loaded before) loads the running step's first; before, both joined
    with the version named last (5), device 1 then served version 5 holding version 4."""

    async def scenario() -> tuple[list[tuple[int, int]], int]:
        run = _Run(version=5)
        pool, hooks = _pool(run, 4)                   # device 1 was named version 4
        assert hooks.current_weights((2,))[0] == 5    # another device, after the run started
        device = pool.state.devices[1]
        device.loaded = 4
        hooks.start_serving(device)
        await pool.settle()
        return run.joined, pool.versions.of(1)

    joined, engine_version = asyncio.run(scenario())
    assert joined == [(1, 5)] and engine_version == 5
