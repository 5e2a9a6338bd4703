"""The twin's chaos campaign: run random trials (`sim.chaos`) at 1024 GPUs, each against the
fault-free run of its variant, and count (`bench/chaos.py`, `dynaresize bench chaos`)."""

from __future__ import annotations

import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dynaresize.config import Config, ResizeEntry, validate
from dynaresize.core.rundir import read_jsonl
from dynaresize.sim.chaos import Trap, Trial, Variant, audit, draw_trial, sample_view
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import run_config, sim_config
from dynaresize.sim.workloads import get_workload

GPUS, ROLLOUT, STEPS = 1024, 896, 4
WORKLOAD = get_workload("dapo-7b", prompts_per_step=64, samples_per_prompt=4,
                        max_response_tokens=2048)
COSTS = get_cost_model("h100-7b")
COUNTS = ("lost", "duplicated", "wrong_version", "changed")


def variant_config(v: Variant) -> Config:
    cfg = sim_config(WORKLOAD, ROLLOUT, GPUS - ROLLOUT, STEPS, v.staleness, 0, COSTS)
    cfg.controller.policy = v.policy
    cfg.run.checkpoint_every = v.checkpoint_every
    if v.resize:
        num = 64 if v.resize == "rollout->train" else 32
        cfg.resize.schedule = [ResizeEntry(step=1, at="start", move=v.resize, num_devices=num)]
    validate(cfg, check_machine=False)
    return cfg


class Campaign:
    """Trials with their fault-free references (one per variant, run once and kept)."""

    def __init__(self, hangs: float = 0.0) -> None:
        self._refs: dict[Variant, tuple[dict[Any, Any], dict[str, int]]] = {}
        self.hangs = hangs
        """Each death a freeze with this probability (`sim.chaos`)."""

    def reference(self, v: Variant) -> tuple[dict[Any, Any], dict[str, int]]:
        if v not in self._refs:
            trap = Trap(())
            with tempfile.TemporaryDirectory(prefix="chaos-ref-") as tmp:
                run_config(variant_config(v), WORKLOAD, COSTS, out_dir=tmp, chaos=trap.install)
                view = sample_view(read_jsonl(Path(tmp) / "samples.jsonl"))
            self._refs[v] = (view, dict(trap.calls))
        return self._refs[v]

    def trial(self, seed: int) -> dict[str, Any]:
        return self.run(draw_trial(seed, lambda v: self.reference(v)[1], self.hangs))

    def run(self, trial: Trial) -> dict[str, Any]:
        """One trial: its row (module `sim.chaos` for the checks)."""
        v = trial.variant
        reference, _ = self.reference(v)
        cfg = variant_config(v)
        trap = Trap(trial.deaths, trial.seed, cfg.faults.hang_timeout_s)
        row: dict[str, Any] = {"seed": trial.seed, **asdict(v),
                               "deaths": [asdict(d) for d in trial.deaths]}
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
            try:
                sim = run_config(cfg, WORKLOAD, COSTS, out_dir=tmp, chaos=trap.install)
            except Exception as exc:
                row.update(finished=False, survived=False,
                           error=f"{type(exc).__name__}: {exc}"[:400],
                           where=traceback.format_exc().splitlines()[-3:])
                sim = None
            row.update(killed=[k for k in trap.fired if k is not None and k >= 0],
                       not_fired=sum(k is None for k in trap.fired))
            if sim is not None:
                devices = sim.orchestrator.state.devices
                row.update(audit(Path(tmp), devices, reference, STEPS, v.checkpoint_every))
                faults = sim.summary.get("faults", [])
                row.update(finished=True, num_recoveries=len(faults),
                           recovery_s=round(sum(f.get("recovery_s", 0.0) for f in faults), 3),
                           replayed_steps=sum(f.get("replayed_steps", 0) for f in faults))
                row["survived"] = all(row[k] == 0 for k in COUNTS) and row["metrics_ok"] \
                    and row["params_ok"] and row.get("final_checkpoint_ok", True)
        row["wall_s"] = round(time.perf_counter() - t0, 3)
        return row


def table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The campaign's totals."""
    done = [r for r in rows if r["finished"]]
    deaths = sum(len(r["killed"]) for r in rows)
    recovery = sorted(r["recovery_s"] for r in done if r.get("num_recoveries"))
    return {"trials": len(rows), "deaths": deaths, "survived": sum(r["survived"] for r in rows),
            "failed": sum(not r["finished"] for r in rows),
            **{k: sum(r.get(k, 0) for r in done) for k in COUNTS},
            "params_wrong": sum(not r["params_ok"] for r in done),
            "final_checkpoint_missing": sum(r.get("final_checkpoint_ok") is False for r in done),
            "recovery_s_median": recovery[len(recovery) // 2] if recovery else 0.0,
            "recovery_s_max": recovery[-1] if recovery else 0.0,
            "replayed_steps": sum(r.get("replayed_steps", 0) for r in done)}


START, END = "<!-- twin-chaos:start -->", "<!-- twin-chaos:end -->"
COLS = ["trials", "deaths", "survived", "failed", "lost", "duplicated", "wrong_version",
        "changed", "params_wrong", "final_checkpoint_missing", "recovery_s_median",
        "recovery_s_max", "replayed_steps"]


def markdown(rows: list[dict[str, Any]], cpu_s: float, hangs: float = 0.0) -> str:
    """The campaign's table: by the first death's phase, by the number of deaths, all."""
    lines = ["| first death in | " + " | ".join(COLS) + " |", "|---" * (len(COLS) + 1) + "|"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["deaths"][0]["phase"], []).append(r)
        groups.setdefault(f"{len(r['deaths'])} death(s) drawn", []).append(r)
    for name in sorted(groups, key=lambda n: (n[0].isdigit(), n)):
        t = table(groups[name])
        lines.append(f"| {name} | " + " | ".join(str(t[c]) for c in COLS) + " |")
    t = table(rows)
    lines.append("| **all** | " + " | ".join(f"**{t[c]}**" for c in COLS) + " |")
    overlap = sum(any(d["after"] is not None for d in r["deaths"]) for r in rows)
    by_s = ", ".join(f"{sum(r['staleness'] == s for r in rows)} at staleness {s}"
                     for s in sorted({r["staleness"] for r in rows}))
    frozen = sum(d.get("how") == "hang" for r in rows for d in r["deaths"])
    flag = f" --hangs {hangs:g}" if hangs else ""
    how = (f"; each death a freeze with probability {hangs:g} ({frozen} drawn), killed "
           f"`faults.hang_timeout_s` later as the live watchdog does") if hangs else ""
    return "\n".join([
        f"`python bench/chaos.py --trials {len(rows)}{flag}` (1024 simulated GPUs, 896 "
        f"rollout / 128 train, 4 steps; trials {by_s}{how}; {cpu_s:.0f} s of CPU on one core, "
        "shared machine).",
        "", *lines, "",
        f"{overlap} trials had a death inside the recovery of another. `lost`/`duplicated`/"
        "`wrong_version`/`changed`: samples missing, recorded twice, with another version or "
        "length than the fault-free run of the same variant; `params_wrong`: a surviving "
        "trainer whose state does not hold every step once; `recovery_s`: virtual seconds "
        "per trial (world rebuild + restore + replay), over trials with a recovery."])


def write_block(path: Path, block: str, hangs: float = 0.0) -> None:
    """Put `block` between the twin-chaos markers of `path` (appended if none); with
    `hangs`, the twin-chaos-hangs ones."""
    start, end = (START, END) if not hangs else (
        START.replace("chaos:", "chaos-hangs:"), END.replace("chaos:", "chaos-hangs:"))
    text = path.read_text()
    if start in text:
        head, rest = text.split(start, 1)
        text = head + start + "\n" + block + "\n" + end + rest.split(end, 1)[1]
    else:
        text += f"\n{start}\n{block}\n{end}\n"
    path.write_text(text)
