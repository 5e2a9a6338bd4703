"""Shared machinery of the twin: a `Config` run on `SimDevice`s in virtual time.

`run_config(cfg, workload, costs, controller, out_dir)` is the one place that builds the
orchestrator for a simulated run: the unchanged `Orchestrator`, `SimDevice`s, a
`VirtualClock`, the `SimPromptSource` stand-in task, and a `RunDir` (in memory, or the same
run-directory files as a live run when `out_dir` is given). `results_row` turns a finished run
into a `results` row of `dynaresize simulate --json`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dynaresize.config import Config, to_toml, validate
from dynaresize.controller import Controller
from dynaresize.orchestrator import Orchestrator
from dynaresize.rundir import RunDir
from dynaresize.sim.clock import VirtualClock
from dynaresize.sim.costs import CostModel
from dynaresize.sim.device import make_devices
from dynaresize.sim.workloads import StepRequests, Workload
from dynaresize.timeline import idle_device_s_per_step


@dataclass(frozen=True)
class SimPrompt:
    id: int
    """The prompt's index within its step (the workload's `prompt`)."""
    tokens: tuple[int, ...]
    """Stand-in: `(num_prompt_tokens,)`; devices look up the true length."""


class SimPromptSource:
    """The orchestrator's task in the twin: stand-in prompts; reward 1 unless truncated."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    def batch(self, step: int, num_prompts: int, seed: int) -> list[SimPrompt]:
        lengths = self.workload.step_requests(step).prompt_tokens
        return [SimPrompt(i, (int(lengths[i]),)) for i in range(num_prompts)]

    def reward(self, prompt: Any, response_tokens: list[int]) -> float:
        return 0.0 if response_tokens[0] >= self.workload.max_response_tokens else 1.0


class StepSubset(Workload):
    """`workload` seen through a step map: step i of this view is step `steps[i]`."""

    def __init__(self, workload: Workload, steps: list[int]) -> None:
        self._inner, self._steps = workload, steps
        self.name = workload.name
        self.prompts_per_step = workload.prompts_per_step
        self.samples_per_prompt = workload.samples_per_prompt
        self.max_response_tokens = workload.max_response_tokens
        self.num_steps = len(steps)

    def step_requests(self, step: int) -> StepRequests:
        return self._inner.step_requests(self._steps[step])


TWIN_MAX_TOKENS_PER_MICRO_BATCH = 16384
"""The twin's GPU deployments train token-budgeted micro-batches balanced over the ranks
(`train.balance`), as GPU trainers do (verl's per-GPU token budget defaults to 16,384); the
measured gain does not depend on the budget between 4k and 64k tokens (docs/simulator.md)."""


def sim_config(workload: Workload, num_rollout: int, num_train: int, steps: int,
               staleness: int, seed: int, costs: CostModel) -> Config:
    """The run configuration the twin hands the orchestrator (validated)."""
    cfg = Config()
    cfg.run.steps, cfg.run.staleness, cfg.run.seed = steps, staleness, seed
    cfg.task.prompts_per_step = workload.prompts_per_step
    cfg.task.samples_per_prompt = workload.samples_per_prompt
    cfg.task.max_new_tokens = workload.max_response_tokens
    cfg.rollout.max_running_requests = costs.max_running_requests
    cfg.rollout.slice_s = 30.0
    cfg.train.micro_batch_size = workload.samples_per_prompt
    cfg.train.max_tokens_per_micro_batch = TWIN_MAX_TOKENS_PER_MICRO_BATCH
    cfg.allocation.num_rollout_devices, cfg.allocation.num_train_devices = num_rollout, num_train
    cfg.devices.backend = "sim"
    cfg.controller.policy = "static"  # the split as given; run_policy sets another
    validate(cfg, check_machine=False)
    return cfg


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC during a run: a step allocates ~10^5 short-lived objects, and
    generation-2 collections otherwise take half the wall time. Collected once after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()


@dataclass
class SimRun:
    """A finished simulated run: its summary.json content and its in-memory records."""

    summary: dict[str, Any]
    rundir: RunDir
    orchestrator: Orchestrator | None = None


def run_config(cfg: Config, workload: Workload, costs: CostModel,
               controller: Controller | None = None,
               out_dir: str | Path | None = None) -> SimRun:
    """Run `cfg` (allocation, schedule, steps, staleness) on SimDevices charged by `costs`,
    lengths from `workload`; `controller` overrides `cfg.controller.policy`. Writes
    config.toml, metrics/events/samples.jsonl and summary.json to `out_dir` if given."""
    clock = VirtualClock()
    devices = make_devices(cfg.num_devices, cfg.allocation.num_rollout_devices, costs,
                           workload, clock)
    rundir = RunDir(out_dir)
    rundir.write_config(to_toml(cfg))
    try:
        orch = Orchestrator(cfg, devices, clock, SimPromptSource(workload), rundir,
                            controller=controller)
        with no_gc():
            summary = clock.run(orch.run())
    finally:
        rundir.close()
    return SimRun(summary, rundir, orch)


def results_row(policy: str, run: SimRun, split: dict[str, int] | None) -> dict[str, Any]:
    """The `results` row of a run: issue 4's keys plus the mean pool sizes."""
    metrics = run.rundir.metrics
    step_s = np.array([m["step_s"] for m in metrics])
    s = run.summary
    return {"policy": policy, "split": split,
            "mean_step_s": round(float(step_s.mean()), 4),
            "p99_step_s": round(float(np.percentile(step_s, 99)), 4),
            "samples_per_s": s["samples_per_s"], "tokens_per_s": s["tokens_per_s"],
            "bubble_fraction": s["bubble_fraction"], "num_resizes": s["num_resizes"],
            "idle_device_s_per_step": round(idle_device_s_per_step(
                s, run.rundir.events, s["steps"]), 2),
            "mean_rollout_devices": round(float(np.mean(
                [m["num_rollout_devices"] for m in metrics])), 2),
            **_churn(run, len(metrics))}


def _churn(run: SimRun, num_steps: int) -> dict[str, float]:
    """Resizes per step and their critical-path seconds per step (orchestrator runs only)."""
    if run.orchestrator is None or not num_steps:
        return {}
    done = [r for r in run.orchestrator.resizes if r.ok]
    return {"resizes_per_step": round(len(done) / num_steps, 3),
            "resize_s_per_step": round(sum(r.critical_path_s for r in done) / num_steps, 2)}


def workload_for_config(cfg: Config, name: str = "balanced") -> Workload:
    """A synthetic workload shaped like `cfg`'s task (prompts x samples per step, lengths
    capped at `task.max_new_tokens`), seeded by `run.seed`: for simulating a live config."""
    from dataclasses import replace

    from dynaresize.sim.workloads import get_workload

    wl = get_workload(name, seed=cfg.run.seed, prompts_per_step=cfg.task.prompts_per_step,
                      samples_per_prompt=cfg.task.samples_per_prompt)
    return replace(wl, max_response_tokens=cfg.task.max_new_tokens)
