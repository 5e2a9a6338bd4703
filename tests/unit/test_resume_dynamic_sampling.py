"""A resumed dynamic-sampling run plans its first steps' up-front prompts from the filter
rates the steps measured on their exact rewards, as the uninterrupted run did: samples.jsonl
keeps rewards rounded to 6 decimals, so rates recomputed from it can judge a group whose
rewards differ by less than 1e-6 without a signal (the twin, a stop and a resume)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynaresize.config import Config, to_toml
from dynaresize.core.rundir import RunDir, read_jsonl
from dynaresize.orchestrator.checkpoint_files import read_latest
from dynaresize.sim.harness import SimPromptSource
from dynaresize.sim.workloads import FilteredWorkload, get_workload

NEAR = 1.0 - 1e-7
"""The twin's reward 0 becomes this: a group of 1 and NEAR has a signal; rounded, it has not."""


class NearTies(SimPromptSource):
    def reward(self, prompt: Any, response_tokens: list[int]) -> float:
        return super().reward(prompt, response_tokens) or NEAR


class Stop(RuntimeError):
    pass


def workload() -> FilteredWorkload:
    pool = get_workload("dapo-7b", seed=0, prompts_per_step=4 * 3, samples_per_prompt=4)
    return FilteredWorkload(pool, 4, 3, 0.4, margin=0.0)


def config(wl: FilteredWorkload) -> Config:
    from dynaresize.sim.costs import get_cost_model
    from dynaresize.sim.harness import TwinFaults, sim_config

    return sim_config(wl, 2, 2, 8, 1, 0, get_cost_model("h100-7b"),
                      TwinFaults(checkpoint_every=2))


def run(out: Path, storage: Any, *, stop_after: int | None = None, resume: bool = False
        ) -> None:
    """The twin's run of `config` in `out`, its devices' training states saved in `storage`;
    `resume`: from the latest checkpoint in `out`."""
    from dynaresize.orchestrator import Orchestrator
    from dynaresize.orchestrator.checkpoint import CheckpointTarget
    from dynaresize.sim.clock import VirtualClock
    from dynaresize.sim.costs import get_cost_model
    from dynaresize.sim.device import make_devices
    from dynaresize.sim.faults import SimProcesses
    from dynaresize.sim.harness import SimWeightIO, _inline_io

    wl = workload()
    cfg = config(wl)
    clock, processes = VirtualClock(), SimProcesses()
    devices = make_devices(cfg.num_devices, 2, get_cost_model("h100-7b"), wl, clock, processes)
    for d in devices:
        d.storage = storage
    resume_from = read_latest(out) if resume else None
    rundir = RunDir(out, resume_step=resume_from[1].num_steps if resume_from else None)
    rundir.write_config(to_toml(cfg))

    def on_step(record: dict[str, Any]) -> None:
        if stop_after is not None and record["step"] + 1 >= stop_after:
            raise Stop(f"stopped after {stop_after} steps")

    orch = Orchestrator(cfg, devices, clock, NearTies(wl), rundir, on_step=on_step,
                        checkpoints=CheckpointTarget(out, 2, SimWeightIO()),
                        resume_from=resume_from, faults=processes)
    try:
        clock.run(_inline_io(orch.run()))
    finally:
        rundir.close()


def view(out: Path) -> list[tuple[Any, ...]]:
    return sorted((r["step"], r["prompt"], r["sample"], r["kept"], r["reward"])
                  for r in read_jsonl(out / "samples.jsonl"))


def test_a_resumed_run_plans_from_the_rates_the_steps_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dynaresize.sim.device import SimDevice
    from dynaresize.sim.faults import SimStorage

    save = SimDevice.save_checkpoint

    async def save_with_dir(device: SimDevice, path: str) -> Any:
        Path(path).mkdir(parents=True, exist_ok=True)  # the twin writes no shard files
        return await save(device, path)

    monkeypatch.setattr(SimDevice, "save_checkpoint", save_with_dir)
    run(tmp_path / "full", SimStorage())
    records = read_jsonl(tmp_path / "full" / "samples.jsonl")
    assert {r["reward"] for r in records} == {1.0}  # every signal is below the rounding
    cut = tmp_path / "cut"
    storage = SimStorage()
    with pytest.raises(Stop):
        run(cut, storage, stop_after=5)
    assert read_latest(cut)[1].num_steps == 4
    run(cut, storage, resume=True)
    assert view(cut) == view(tmp_path / "full")
