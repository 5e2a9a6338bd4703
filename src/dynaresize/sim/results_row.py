"""A finished twin run (`sim.harness.SimRun`) as a `results` row of `dynaresize simulate
--json`: issue 4's keys, the mean pool sizes, and, where they apply, the fault, churn and
speculation columns (a run without them keeps the row it always had)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dynaresize.core.timeline import idle_device_s_per_step
from dynaresize.sim.harness import SimRun

__all__ = ["fault_columns", "results_row", "speculation_columns"]


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
                [m["num_rollout_devices"] for m in metrics])), 2), **fault_columns(s),
            **_churn(run, len(metrics)), **speculation_columns(run)}


def speculation_columns(run: SimRun) -> dict[str, Any]:
    """With speculation: accepted tokens per speculating request-iteration and the share of
    request-iterations that speculated (the run's shared `SpecTable`)."""
    if run.orchestrator is None:
        return {}
    table = getattr(run.orchestrator.state.devices[0].engine, "table", None)
    if table is None:
        return {}
    got = table.stats()
    return {"accepted_per_iteration": got["accepted_per_iteration"],
            "speculating_share": got["speculating_share"]}


def fault_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """A faulty run's extra `results` keys: deaths, recovery time, replayed optimizer steps,
    entries that never fired (none for a run without faults, whose row stays as it was)."""
    if "faults" not in summary:
        return {}
    faults = summary["faults"]
    return {"num_faults": summary["num_faults"],
            "recovery_s": round(sum(f.get("recovery_s", 0.0) for f in faults), 4),
            "replayed_steps": sum(f.get("replayed_steps", 0) for f in faults),
            "kills_not_fired": len(summary.get("kills_not_fired", []))}


def _churn(run: SimRun, num_steps: int) -> dict[str, float]:
    """Resizes per step and their critical-path seconds per step, and requests migrated per
    step by tail packing and spreading (orchestrator runs only)."""
    if run.orchestrator is None or not num_steps:
        return {}
    done = [r for r in run.orchestrator.resizer.reports if r.ok]
    return {"resizes_per_step": round(len(done) / num_steps, 3),
            "resize_s_per_step": round(sum(r.critical_path_s for r in done) / num_steps, 2),
            "migrated_per_step": round(run.orchestrator.rollout.num_migrated / num_steps, 1)}
