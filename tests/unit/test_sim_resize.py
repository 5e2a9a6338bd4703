"""Resizes in the twin: SimDevice resize ops under the unchanged resize executor, and the
live-vs-sim equivalence of a forced schedule (acceptance 1, simulated half)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dynaresize.config import Config, load_config
from dynaresize.core.rundir import read_jsonl
from dynaresize.core.timeline import allocation_sequence, resize_sequence
from dynaresize.sim.clock import VirtualClock
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.device import SimDevice
from dynaresize.sim.harness import run_config, workload_for_config
from dynaresize.sim.resize_costs import reshard_bytes
from dynaresize.sim.workloads import get_workload

# the live test's config and forced schedule (tests/integration/test_resize_live.py)
BASE = ["run.steps=4", "run.staleness=1", "task.prompts_per_step=4", "task.samples_per_prompt=4",
        "task.max_new_tokens=16", "train.micro_batch_size=2", "output.progress='plain'",
        "rollout.max_running_requests=8", "rollout.slice_s=0.02",
        "resize.staging_bytes=4096"]
SCHEDULE = ("resize.schedule=["
            "{step=0, at='rollout:0.5', move='rollout->train', num_devices=1},"
            "{step=1, at='start', move='train->rollout', num_devices=2},"
            "{step=2, at='rollout:0.3', move='rollout->train', num_devices=1},"
            "{step=3, at='rollout:0.4', move='train->rollout', num_devices=1}]")

TO_TRAIN = ("resize.export_inflight", "resize.release_kv", "resize.release_rollout_weights",
            "resize.stop_admission")
TO_ROLLOUT = ("resize.alloc_kv", "resize.drop_trainer", "resize.load_weights",
              "resize.start_serving")


def _expected(index: int, moved: tuple[int, ...], members: tuple[int, ...],
              kinds: tuple[str, ...]) -> list[tuple]:
    rows = [(index, "resize", moved, True), (index, "resize.commit", members, True),
            (index, "resize.join_group", (0, 1, 2, 3), True),
            (index, "resize.reshard", members, True)]
    rows += [(index, k, moved, True) for k in kinds]
    return sorted(rows, key=lambda r: (r[0], r[1]))


EXPECTED = (_expected(0, (1,), (1, 2, 3), TO_TRAIN) + _expected(1, (1, 2), (1, 2, 3), TO_ROLLOUT)
            + _expected(2, (2,), (2, 3), TO_TRAIN) + _expected(3, (2,), (2, 3), TO_ROLLOUT))
"""What the live run of the schedule records: the planner picks devices deterministically
(rollout→train: highest rollout index; train→rollout: lowest training index)."""


def simulate_live_config(out: Path | None = None) -> tuple[Config, list[dict]]:
    cfg = load_config(None, [*BASE, SCHEDULE], check_machine=False)
    run = run_config(cfg, workload_for_config(cfg), get_cost_model("h100-7b"), out_dir=out)
    return cfg, run.rundir.events


def test_forced_schedule_sim_sequence(tmp_path: Path) -> None:
    cfg, events = simulate_live_config(tmp_path)
    seq = resize_sequence(events)
    assert seq == EXPECTED
    assert allocation_sequence(seq, 2, 4) == [(0, 1), (0,), (0, 1, 2), (0, 1), (0, 1, 2)]
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert sum(m["num_resizes"] for m in metrics) == 4
    assert (metrics[-1]["num_rollout_devices"], metrics[-1]["num_train_devices"]) == (3, 1)
    # the written run directory has the same events as the in-memory record
    assert resize_sequence(read_jsonl(tmp_path / "events.jsonl")) == EXPECTED
    reshard = [e for e in events if e["kind"] == "resize.reshard"]
    assert any(e["bytes"] > 0 for e in events if e["kind"] == "resize")
    assert all(e["t_end"] > e["t_start"] for e in reshard)


def test_join_group_is_cached_per_member_set() -> None:
    costs = get_cost_model("h100-7b")
    clock = VirtualClock()
    dev = SimDevice(0, costs, get_workload("balanced"), clock)

    async def go() -> list[tuple[bool, float]]:
        out = []
        for members in ((0, 1), (1, 0), (0, 2)):
            t0 = clock.now()
            created = await dev.join_group(members)
            out.append((created, clock.now() - t0))
        return out

    got = clock.run(go())
    r = costs.resize
    assert got == [(True, pytest.approx(r.join_group_first_s)),
                   (False, pytest.approx(r.join_group_cached_s)),
                   (True, pytest.approx(r.join_group_first_s))]


def test_reshard_bytes_even_split() -> None:
    sent, busiest = reshard_bytes((2, 3), (1, 2, 3), 600.0)
    # old: 2 owns [0,300), 3 owns [300,600); new: 1 [0,200), 2 [200,400), 3 [400,600)
    assert sent == {1: 0.0, 2: 200.0, 3: 100.0}
    assert busiest == 200.0
    assert reshard_bytes((1, 2), (1, 2), 100.0)[1] == 0.0


def test_reshard_time_grows_with_smaller_staging() -> None:
    costs = get_cost_model("h100-7b")
    big, _ = costs.reshard_plan_s((4, 5, 6, 7), (5, 6, 7), 1 << 30)
    small, _ = costs.reshard_plan_s((4, 5, 6, 7), (5, 6, 7), 1 << 20)
    assert small > big > 0


def test_sim_device_release_kv_refuses_busy_engine() -> None:
    costs = get_cost_model("h100-7b")
    clock = VirtualClock()
    wl = get_workload("balanced", prompts_per_step=1, samples_per_prompt=2)
    dev = SimDevice(0, costs, wl, clock)
    from dynaresize.core.types import RequestSpec

    async def go() -> None:
        await dev.submit([RequestSpec(0, 0, 0, 0, (5,), 100, 1)])
        await dev.release_kv()

    with pytest.raises(AssertionError):
        clock.run(go())
    assert asyncio.iscoroutinefunction(dev.reshard)
