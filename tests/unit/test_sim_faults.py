"""Device deaths in the twin at 1024 simulated GPUs, recovered by the live recovery code
(`recovery.Recovery`, `faults.FaultInjector`, `checkpoint.Checkpointer`): a rollout device
mid-rollout, a training device mid-step, a device mid-resize. Each run finishes with every
sample of every step recorded exactly once, with the version a run without faults gives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynaresize.config import Config
from dynaresize.core.rundir import read_jsonl
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import SimRun, run_config, sim_config
from dynaresize.sim.workloads import get_workload

GPUS, ROLLOUT, STEPS = 1024, 896, 3
WORKLOAD = get_workload("dapo-7b", prompts_per_step=64, samples_per_prompt=4,
                        max_response_tokens=2048)
COSTS = get_cost_model("h100-7b")


def config(*kills: dict[str, Any], schedule: list[dict[str, Any]] | None = None,
           checkpoint_every: int = 0) -> Config:
    from dynaresize.config import KillEntry, ResizeEntry, validate

    cfg = sim_config(WORKLOAD, ROLLOUT, GPUS - ROLLOUT, STEPS, 1, 0, COSTS)
    cfg.run.checkpoint_every = checkpoint_every
    cfg.faults.kill = [KillEntry(**k) for k in kills]
    cfg.resize.schedule = [ResizeEntry(**e) for e in schedule or []]
    validate(cfg, check_machine=False)
    return cfg


def sample_view(out: Path) -> dict[tuple[int, int, int], tuple[int, int]]:
    """(step, prompt, sample) -> (version, response tokens); each sample exactly once."""
    records = read_jsonl(out / "samples.jsonl")
    view = {(s["step"], s["prompt"], s["sample"]): (s["version"], s["response_tokens"])
            for s in records}
    assert len(view) == len(records), "a sample was recorded twice"
    return view


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int, int], Any]:
    out = tmp_path_factory.mktemp("reference")
    run_config(config(), WORKLOAD, COSTS, out_dir=out)
    view = sample_view(out)
    assert len(view) == STEPS * 64 * 4
    assert {v for v, _ in view.values()} == {0, 1}  # staleness 1: steps 0, 1 on v0; 2 on v1
    return view


def run(out: Path, cfg: Config) -> tuple[SimRun, dict[str, Any]]:
    sim = run_config(cfg, WORKLOAD, COSTS, out_dir=out)
    summary = sim.summary
    assert summary["num_faults"] == 1 and len(summary["kills"]) == 1
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == list(range(STEPS))
    return sim, summary["faults"][0]


def test_rollout_device_dies_mid_rollout(reference: dict, tmp_path: Path) -> None:
    victim = 5
    _, fault = run(tmp_path, config({"device": victim, "step": 1, "at": "rollout:0.3"}))
    assert sample_view(tmp_path) == reference  # nothing lost, duplicated or re-versioned
    assert fault["device"] == victim and fault["role"] == "rollout"
    assert fault["rerun_requests"] >= 1 and not fault["restored"]
    later = [s for s in read_jsonl(tmp_path / "samples.jsonl") if s["step"] == 2]
    assert victim not in {s["device"] for s in later}  # the dead device left the pool
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert metrics[-1]["num_rollout_devices"] == ROLLOUT - 1


def test_train_device_dies_mid_step(reference: dict, tmp_path: Path) -> None:
    sim, fault = run(tmp_path, config({"device": 1000, "step": 1, "at": "train"}))
    assert sample_view(tmp_path) == reference
    assert fault["device"] == 1000 and fault["role"] == "train" and fault["restored"]
    assert fault["replayed_steps"] == 1  # no checkpoint: from version 0, replay step 0
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["num_train_devices"] for m in metrics] == [128, 127, 127]
    assert [m["policy_version"] for m in metrics] == [0, 0, 1]
    survivors = [d for d in sim.orchestrator.state.devices if d.alive]
    # every trainer holds the state after every step, once (SimDevice checks each update)
    assert {d.train_steps for d in survivors if d.train_members} == {STEPS}
    assert fault["recovery_s"] >= COSTS.recovery.rebuild_world_s(GPUS - 1)


def test_train_device_dies_with_a_checkpoint(reference: dict, tmp_path: Path) -> None:
    _, fault = run(tmp_path, config({"device": 1000, "step": 2, "at": "train"},
                                    checkpoint_every=1))
    assert sample_view(tmp_path) == reference
    assert fault["restored"] and fault["replayed_steps"] == 0  # the checkpoint after step 1
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000003"
    load_s = COSTS.recovery.load_s(COSTS.model, GPUS - ROLLOUT - 1)
    assert fault["recovery_s"] >= load_s + COSTS.recovery.rebuild_world_s(GPUS - 1)


@pytest.mark.parametrize("victim", [895, 1000], ids=["moving-rollout-device", "trainer"])
def test_device_dies_mid_resize(reference: dict, tmp_path: Path, victim: int) -> None:
    move = [{"step": 1, "at": "start", "move": "rollout->train", "num_devices": 64}]
    sim, fault = run(tmp_path, config({"device": victim, "step": 1, "at": "resize"},
                                      schedule=move))
    assert sample_view(tmp_path) == reference
    assert sim.summary["num_resizes"] == 0 and sim.summary["num_failed_resizes"] == 1
    assert fault["device"] == victim
    assert fault["restored"] == (victim >= ROLLOUT)  # a trainer's shards are gone
    last = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    survivors = (ROLLOUT - (victim < ROLLOUT), GPUS - ROLLOUT - (victim >= ROLLOUT))
    assert (last["num_rollout_devices"], last["num_train_devices"]) == survivors


def test_trainer_dies_in_a_streamed_step(reference: dict, tmp_path: Path) -> None:
    """hysteresis streams training (train_accumulate ... train_finish): the kill lands in the
    step's train_finish; the step reruns unstreamed on the survivors."""
    cfg = config({"device": 1000, "step": 1, "at": "train"})
    cfg.controller.policy = "hysteresis"
    sim, fault = run(tmp_path, cfg)
    assert sim.orchestrator.streaming
    assert sample_view(tmp_path) == reference
    assert fault["device"] == 1000 and fault["restored"] and fault["replayed_steps"] == 1


def test_trainer_dies_inside_a_checkpoint_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               reference: dict[tuple[int, int, int], Any]
                                               ) -> None:
    """A training rank lost while the group writes a checkpoint (a collective): that
    checkpoint is not a recovery point, the next step restores the previous one and replays;
    nothing is lost (live: a node removed mid-save failed the whole run)."""
    from dynaresize.sim.device import SimDevice
    from dynaresize.sim.faults import SimProcesses

    tables: list[SimProcesses] = []
    orig_add = SimProcesses.add

    def add(self: SimProcesses, device: Any) -> None:
        if not tables:
            tables.append(self)
        orig_add(self, device)

    monkeypatch.setattr(SimProcesses, "add", add)
    orig = SimDevice.save_checkpoint
    calls: list[int] = []

    async def save_checkpoint(self: SimDevice, path: str) -> dict[str, float]:
        calls.append(self.index)
        if len(calls) == 1 + (GPUS - ROLLOUT):  # the second save's first rank: kill it
            tables[0].kill(self.index)
        return await orig(self, path)

    monkeypatch.setattr(SimDevice, "save_checkpoint", save_checkpoint)
    out = tmp_path / "run"
    sim = run_config(config(checkpoint_every=1), WORKLOAD, COSTS, out_dir=out)
    assert sim.summary["num_faults"] == 1
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == list(range(STEPS))
    assert sample_view(out) == reference


@pytest.mark.parametrize("at,victim", [("rollout:0.3", 5), ("train", 1000)])
def test_a_hung_device_is_killed_after_the_watchdog_bound(reference: dict, tmp_path: Path,
                                                           at: str, victim: int) -> None:
    """`how = "hang"` freezes the device: nothing it runs finishes and its training group's
    collectives wait for it, until `faults.hang_timeout_s` later the watchdog's kill turns it
    into an ordinary death. The records are the fault-free run's; the run is later than with
    a plain kill by most of the bound (the rollout, or the whole training group, waited)."""
    killed = tmp_path / "kill"
    run(killed, config({"device": victim, "step": 1, "at": at}))
    cfg = config({"device": victim, "step": 1, "at": at, "how": "hang"})
    cfg.faults.hang_timeout_s = 20.0
    hung = tmp_path / "hang"
    _, fault = run(hung, cfg)
    assert sample_view(hung) == reference
    assert fault["device"] == victim
    assert fault["cause"] == "hung: answered no ping for 20.0 s, killed"

    def total_s(out: Path) -> float:
        return sum(m["step_s"] for m in read_jsonl(out / "metrics.jsonl"))

    assert 10.0 < total_s(hung) - total_s(killed) <= 20.0 + 1e-6
