"""A death that empties a pool (its only device: e.g. a resize had left one trainer, or one
rollout device), in the twin: recovery moves a live device of the other pool into it
(`Resizer.reassign`), restores the trainers' state and the run finishes with the same sample
records as a run without faults. Before this, the train loop retried the failing repair
forever (live: the run hung); a rollout pool emptied while the train loop waited for that
rollout deadlocked. Each run is bounded: it runs in a thread joined with a timeout, so a hang
fails the test instead of hanging it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dynaresize.config import Config, KillEntry, ResizeEntry, validate
from dynaresize.core.rundir import read_jsonl
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import SimRun, run_config, sim_config
from dynaresize.sim.workloads import get_workload

STEPS, NUM_DEVICES = 3, 4
WORKLOAD = get_workload("dapo-7b", prompts_per_step=8, samples_per_prompt=4,
                        max_response_tokens=512)
COSTS = get_cost_model("h100-7b")
BOUND_S = 60.0
"""Wall seconds a run may take (a few tenths of a second when it works)."""


def config(num_rollout: int, staleness: int, kill: dict[str, Any] | None = None,
           move: tuple[str, int] | None = None, policy: str = "static") -> Config:
    cfg = sim_config(WORKLOAD, num_rollout, NUM_DEVICES - num_rollout, STEPS, staleness, 0,
                     COSTS)
    cfg.controller.policy = policy
    cfg.faults.kill = [KillEntry(**kill)] if kill else []
    if move is not None:
        cfg.resize.schedule = [ResizeEntry(step=1, at="start", move=move[0],
                                           num_devices=move[1])]
    validate(cfg, check_machine=False)
    return cfg


def bounded_run(cfg: Config, out: Path) -> SimRun:
    """`run_config` in a daemon thread; fails (does not hang) if it runs past `BOUND_S`."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["sim"] = run_config(cfg, WORKLOAD, COSTS, out_dir=out)
        except BaseException as exc:  # handed to the test thread
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"the run did not finish in {BOUND_S} s (recovery hangs)"
    if "error" in result:
        raise result["error"]
    return result["sim"]


def sample_view(out: Path) -> dict[tuple[int, int, int], tuple[int, int]]:
    records = read_jsonl(out / "samples.jsonl")
    view = {(s["step"], s["prompt"], s["sample"]): (s["version"], s["response_tokens"])
            for s in records}
    assert len(view) == len(records), "a sample was recorded twice"
    assert len(view) == STEPS * WORKLOAD.prompts_per_step * WORKLOAD.samples_per_prompt
    return view


CASES = {  # name: (rollout devices, kill, scheduled move, the pool refilled)
    "only-trainer-dies-mid-step": (3, {"device": 3, "step": 1, "at": "train"}, None, "train"),
    "only-trainer-dies-mid-resize": (3, {"device": 3, "step": 1, "at": "resize"},
                                     ("rollout->train", 2), "train"),
    "only-rollout-device-dies": (1, {"device": 0, "step": 1, "at": "rollout:0.3"}, None,
                                 "rollout"),
    "only-rollout-device-dies-at-once": (1, {"device": 0, "step": 1, "at": "rollout:0.0"},
                                         None, "rollout"),
    # found live (bench/chaos_live.py --mode trap, seed 6): the rollout device a resize left
    # alone dies in it; the trainer reassigned to the rollout had no engine, but counted as
    # holding version 0 (the version steps 0-1 need at staleness 1), so requests were
    # submitted to it before any weights were loaded (`ResizeHooks.engine_gone`)
    "last-rollout-device-dies-mid-resize": (2, {"device": 0, "step": 1, "at": "resize"},
                                            ("rollout->train", 1), "rollout"),
}


@pytest.mark.parametrize("staleness", [0, 1])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_death_that_empties_a_pool_is_recovered(case: str, staleness: int,
                                                  tmp_path: Path) -> None:
    num_rollout, kill, move, refilled = CASES[case]
    reference = tmp_path / "reference"
    bounded_run(config(num_rollout, staleness, move=move), reference)
    out = tmp_path / "faulty"
    sim = bounded_run(config(num_rollout, staleness, kill, move), out)
    assert sample_view(out) == sample_view(reference)  # nothing lost, duplicated, re-versioned
    [fault] = sim.summary["faults"]
    assert fault["device"] == kill["device"] and fault["restored"]
    assert fault["reassigned"]["to"] == refilled
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(STEPS))
    last = metrics[-1]
    assert last["num_rollout_devices"] >= 1 and last["num_train_devices"] >= 1
    assert last["num_rollout_devices"] + last["num_train_devices"] == NUM_DEVICES - 1



@pytest.mark.parametrize("staleness", [0, 1])
@pytest.mark.parametrize("case", sorted(CASES))
def test_under_hysteresis_the_same_deaths_keep_the_records(case: str, staleness: int,
                                                           tmp_path: Path) -> None:
    """hysteresis streams training and pipelines rollouts (a tail may hold a rollout device
    when a pool is refilled); its own moves may have refilled the pool first."""
    num_rollout, kill, move, _ = CASES[case]
    reference = tmp_path / "reference"
    bounded_run(config(num_rollout, staleness, move=move, policy="hysteresis"), reference)
    out = tmp_path / "faulty"
    sim = bounded_run(config(num_rollout, staleness, kill, move, "hysteresis"), out)
    assert sample_view(out) == sample_view(reference)
    assert sim.summary["num_faults"] == 1
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == list(range(STEPS))


@pytest.mark.parametrize("staleness", [1, 2])
@pytest.mark.parametrize("second", ["rollout", "recovery"])
def test_both_rollout_devices_die_while_a_tail_runs(staleness: int, second: str,
                                                    tmp_path: Path) -> None:
    """Found live (`bench/chaos_live.py --mode trap`, seed 10): a rollout device died, then
    the other one (later in the rollout, or inside the first one's recovery) while the
    previous step's tail ran on it (pipelined). The tail looked for an engine of the newest
    run to finish its requests, found none and failed the run; now it waits for the one
    recovery reassigns from training. The trap places the deaths with pipelining on (a
    `[[faults.kill]]` entry turns it off)."""
    from dynaresize.app.chaos_live import LiveTrap
    from dynaresize.sim.chaos import Death

    reference = tmp_path / "reference"
    bounded_run(config(2, staleness, policy="hysteresis"), reference)
    trap = LiveTrap((Death("rollout", 3, 0.0, "caller"),
                     Death(second, 0, 0.0, "rollout", after=0)))
    out = tmp_path / "faulty"
    sim = run_config(config(2, staleness, policy="hysteresis"), WORKLOAD, COSTS, out_dir=out,
                     chaos=trap.install)
    assert sorted(trap.fired) == [0, 1]  # both rollout devices
    assert sample_view(out) == sample_view(reference)
    assert any(f.get("reassigned", {}).get("to") == "rollout" for f in sim.summary["faults"])
