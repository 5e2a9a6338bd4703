"""`simulate`: the unchanged `Orchestrator` on `SimDevice`s in virtual time, per policy.

Per policy, one run = `Orchestrator(cfg, make_devices(...), clock, SimPromptSource(workload),
RunDir(None)).run()` under `VirtualClock.run`; its metrics become a `results` row of issue 4:
`{"policy","split","mean_step_s","p99_step_s","samples_per_s","tokens_per_s",
"bubble_fraction","num_resizes"}`. `oracle` is computed by `oracle.py` (resizes free).

`static` reports the best split in hindsight, found coarse-to-fine: evaluate ~8 rollout-device
counts spread over 1..N-1 on a probe (`probe_steps` steps spread evenly over the run), then
repeatedly evaluate the neighbours of the best at half the spacing until the spacing is 1;
finally the whole run at the best split. It assumes the mean step time is unimodal in the split
(true of the cost model: more rollout devices shorten rollout and lengthen training).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynaresize.config import Config, validate
from dynaresize.orchestrator import Orchestrator
from dynaresize.rundir import RunDir
from dynaresize.sim.clock import VirtualClock
from dynaresize.sim.costs import CostModel, get_cost_model
from dynaresize.sim.device import make_devices
from dynaresize.sim.oracle import oracle_result, oracle_steps
from dynaresize.sim.workloads import StepRequests, Workload, resolve_workload

SIM_POLICIES = ("static", "oracle")


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


class _StepSubset(Workload):
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


def sim_config(workload: Workload, num_rollout: int, num_train: int, steps: int,
               staleness: int, seed: int, costs: CostModel) -> Config:
    """The run configuration the twin hands the orchestrator."""
    cfg = Config()
    cfg.run.steps, cfg.run.staleness, cfg.run.seed = steps, staleness, seed
    cfg.task.prompts_per_step = workload.prompts_per_step
    cfg.task.samples_per_prompt = workload.samples_per_prompt
    cfg.task.max_new_tokens = workload.max_response_tokens
    cfg.rollout.max_running_requests = costs.max_running_requests
    cfg.rollout.slice_s = 30.0
    cfg.train.micro_batch_size = workload.samples_per_prompt
    cfg.allocation.num_rollout_devices, cfg.allocation.num_train_devices = num_rollout, num_train
    cfg.devices.backend = "sim"
    validate(cfg, check_machine=False)
    return cfg


@contextmanager
def _no_gc() -> Iterator[None]:
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


def run_static(workload: Workload, gpus: int, num_rollout: int, steps: int, staleness: int,
               seed: int, costs: CostModel) -> dict[str, Any]:
    """One orchestrator run at a fixed split; returns its results row."""
    cfg = sim_config(workload, num_rollout, gpus - num_rollout, steps, staleness, seed, costs)
    clock = VirtualClock()
    devices = make_devices(gpus, num_rollout, costs, workload, clock)
    rundir = RunDir(None)
    with _no_gc():
        summary = clock.run(Orchestrator(cfg, devices, clock, SimPromptSource(workload),
                                         rundir).run())
    step_s = np.array([m["step_s"] for m in rundir.metrics])
    return {"policy": "static", "split": {"rollout": num_rollout, "train": gpus - num_rollout},
            "mean_step_s": float(step_s.mean()), "p99_step_s": float(np.percentile(step_s, 99)),
            "samples_per_s": summary["samples_per_s"], "tokens_per_s": summary["tokens_per_s"],
            "bubble_fraction": summary["bubble_fraction"],
            "num_resizes": summary["num_resizes"]}


def best_static(workload: Workload, gpus: int, steps: int, staleness: int, seed: int,
                costs: CostModel, probe_steps: int = 4) -> dict[str, Any]:
    """Coarse-to-fine search of the split (module docstring); the full run at the best."""
    if gpus < 2:
        raise ValueError(f"gpus = {gpus}: static needs at least 2 (one per stage)")
    probe = _StepSubset(workload, sorted({int(k) for k in
                                          np.linspace(0, steps - 1, min(steps, probe_steps))}))
    scores: dict[int, float] = {}

    def score(r: int) -> float:
        if r not in scores:
            scores[r] = run_static(probe, gpus, r, probe.num_steps or 1, staleness, seed,
                                   costs)["mean_step_s"]
        return scores[r]

    spacing = max(1, (gpus - 2) // 8)
    best = min(range(1, gpus, spacing), key=score)
    while spacing > 1:
        spacing = max(1, spacing // 2)
        best = min((r for r in (best - spacing, best, best + spacing) if 1 <= r < gpus),
                   key=score)
    row = run_static(workload, gpus, best, steps, staleness, seed, costs)
    row["num_splits_tried"] = len(scores)
    return row


def simulate(workload: str | Workload, gpus: int, policies: tuple[str, ...] = SIM_POLICIES,
             steps: int = 50, staleness: int = 1, seed: int = 0,
             cost_model: str | CostModel = "h100-7b",
             requests_per_step: int | None = None) -> dict[str, Any]:
    """Compare `policies` on one workload; the JSON object of `dynaresize simulate --json`."""
    wl = workload if isinstance(workload, Workload) else resolve_workload(
        workload, seed=seed, requests_per_step=requests_per_step)
    costs = cost_model if isinstance(cost_model, CostModel) else get_cost_model(cost_model)
    if wl.num_steps is not None and steps > wl.num_steps:
        raise ValueError(f"steps = {steps}: the trace {wl.name} has {wl.num_steps}")
    results = []
    for policy in policies:
        if policy == "static":
            results.append(best_static(wl, gpus, steps, staleness, seed, costs))
        elif policy == "oracle":
            results.append(oracle_result(oracle_steps(costs, wl, gpus, steps, staleness)))
        else:
            raise ValueError(f"policy {policy!r}: allowed in the simulator: "
                             f"{', '.join(SIM_POLICIES)}")
    return {"workload": wl.name, "gpus": gpus, "steps": steps, "results": results}
