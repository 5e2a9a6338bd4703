"""Staleness k >= 2 in the twin: how far hysteresis is from the oracle's work bound and from the
`fully-async` reference at the same k, and why (issue 25 part 3). Written to docs/results.md
(between `<!-- depth-gap:start -->` and `<!-- depth-gap:end -->`).

    python bench/depth_gap.py                  # the cases below, s = 1 and 2, 8 steps
    python bench/depth_gap.py --cases 0 --steps 4 --no-write

Per tailed case, speculation (off, and the `das` preset, every policy alike) and staleness:
`simulate` with static, hysteresis, fully-async and oracle; the oracle's work bound
(`sim.oracle.work_samples_per_s`); and one hysteresis run at the static split with every
submission and completion recorded per engine (`BatchRecorder`): an engine's mean batch
(requests it holds, time-weighted over the time it holds any) and the share of rollout time
during which two or more (three or more) steps had requests on engines (how deep the pipeline
actually went).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dynaresize.control.registry import POLICIES as CONTROLLERS
from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import run_config, sim_config
from dynaresize.sim.oracle import oracle_steps, work_samples_per_s
from dynaresize.sim.resolve import resolve_workload
from dynaresize.sim.run import simulate
from dynaresize.sim.speculation import resolve_speculation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policies import write_block  # noqa: E402  (bench/ is not a package)

START, END = "<!-- depth-gap:start -->", "<!-- depth-gap:end -->"
CASES = [("dapo-7b", 32, 2048), ("dapo-7b", 64, 4096), ("agentic", 32, 1024)]
POLICIES = ("static", "hysteresis", "fully-async", "oracle")
STALENESS = (1, 2)
Key = tuple[int, int, int]


class BatchRecorder:
    """The twin's recording hook: which engine holds which request, integrated over time.

    An export is not reported to the recorder; a request counts on its old engine until it is
    submitted to another one (an export's cost is milliseconds of a slice of seconds)."""

    def __init__(self) -> None:
        self.where: dict[Key, int] = {}
        self.held: dict[int, set[Key]] = {}
        self.last_s: dict[int, float] = {}
        self.request_s: dict[int, float] = {}
        """engine -> integral of the requests it holds over time (request-seconds)."""
        self.busy_s: dict[int, float] = {}
        """engine -> seconds it held at least one request."""
        self.steps_at: list[tuple[float, int]] = []
        """(time, number of steps with a request on some engine) at each change."""

    def _advance(self, device: int, now_s: float) -> None:
        held = self.held.setdefault(device, set())
        dt = now_s - self.last_s.get(device, now_s)
        if held:
            self.request_s[device] = self.request_s.get(device, 0.0) + dt * len(held)
            self.busy_s[device] = self.busy_s.get(device, 0.0) + dt
        self.last_s[device] = now_s

    def _steps_changed(self, now_s: float) -> None:
        steps = {key[0] for key in self.where}
        self.steps_at.append((now_s, len(steps)))

    def submitted(self, device: int, requests: Sequence[RequestSpec | InflightRequest],
                  now_s: float) -> None:
        for r in requests:
            spec = r.spec if isinstance(r, InflightRequest) else r
            key = (spec.step, spec.prompt, spec.sample)
            old = self.where.get(key)
            if old is not None and old != device:
                self._advance(old, now_s)
                self.held[old].discard(key)
            self._advance(device, now_s)
            self.held[device].add(key)
            self.where[key] = device
        self._steps_changed(now_s)

    def finished(self, device: int, completions: Sequence[Completion], now_s: float,
                 until_empty: bool) -> None:
        self._advance(device, now_s)
        for c in completions:
            key = (c.spec.step, c.spec.prompt, c.spec.sample)
            self.held[device].discard(key)
            self.where.pop(key, None)
        self._steps_changed(now_s)

    def mean_batch(self) -> float:
        busy = sum(self.busy_s.values())
        return sum(self.request_s.values()) / busy if busy else 0.0

    def overlap_share(self, depth: int) -> float:
        """Share of the time any request ran during which `depth` or more steps had one."""
        total = deep = 0.0
        for (t0, n), (t1, _) in zip(self.steps_at, self.steps_at[1:], strict=False):
            if n:
                total += t1 - t0
                deep += (t1 - t0) if n >= depth else 0.0
        return deep / total if total else 0.0


def costs_for(speculation: str) -> Any:
    costs = get_cost_model("h100-7b")
    spec = resolve_speculation(speculation)
    return costs if spec is None else replace(costs, speculation=spec)


def batch_of(workload: Any, gpus: int, split: int, steps: int, staleness: int,
             speculation: str) -> dict[str, float]:
    """hysteresis at `split`, every request recorded per engine (module doc)."""
    costs = costs_for(speculation)
    cfg = sim_config(workload, split, gpus - split, steps, staleness, 0, costs)
    cfg.controller.policy = "hysteresis"
    rec = BatchRecorder()
    run_config(cfg, workload, costs, CONTROLLERS["hysteresis"](cfg), recorder=rec)
    return {"mean_batch": rec.mean_batch(), "max_running": costs.max_running_requests,
            "two_steps": rec.overlap_share(2), "three_steps": rec.overlap_share(3)}


def run_case(case: int, staleness: int, steps: int, speculation: str) -> dict[str, Any]:
    workload, gpus, requests = CASES[case]
    wl = resolve_workload(workload, seed=0, requests_per_step=requests)
    out = simulate(wl, gpus, POLICIES, steps=steps, staleness=staleness, seed=0,
                   requests_per_step=requests, speculation=speculation)
    rows = {r["policy"]: r for r in out["results"]}
    work = work_samples_per_s(oracle_steps(costs_for(speculation), wl, gpus, steps,
                                           staleness))
    batch = batch_of(wl, gpus, rows["static"]["split"]["rollout"], steps, staleness,
                     speculation)
    return {"workload": workload, "gpus": gpus, "requests": requests, "staleness": staleness,
            "speculation": speculation, **{p: rows[p]["samples_per_s"] for p in POLICIES},
            "work_bound": work, **batch}


HEADER = ["| workload | GPUs | speculation | s | static | hysteresis | fully-async* | oracle "
          "| oracle work bound | hyst / work bound | hyst / fully-async | mean engine batch "
          "(hyst) | time with >= 2 / >= 3 steps rolling out |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]


def table_line(r: dict[str, Any]) -> str:
    return (f"| {r['workload']} ({r['requests']} req/step) | {r['gpus']} "
            f"| {r['speculation']} | {r['staleness']} "
            f"| {r['static']:.2f} | {r['hysteresis']:.2f} | {r['fully-async']:.2f} "
            f"| {r['oracle']:.2f} | {r['work_bound']:.2f} "
            f"| {r['hysteresis'] / r['work_bound']:.3f} "
            f"| {r['hysteresis'] / r['fully-async']:.3f} "
            f"| {r['mean_batch']:.1f} of {r['max_running']} "
            f"| {r['two_steps']:.0%} / {r['three_steps']:.0%} |")


def render(records: list[dict[str, Any]], steps: int, wall_s: float) -> str:
    head = (f"Samples/s in the twin (h100-7b), {steps} steps, seed 0, every row of a line "
            f"with the same speculation; the batch and depth columns from a recorded "
            f"hysteresis run at the static split. "
            f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {wall_s:.0f} s "
            f"wall on a shared 2-core machine. Reproduce: `python bench/depth_gap.py`. "
            f"*`fully-async` changes the RL semantics (partial rollouts mix policy versions).")
    return "\n".join([head, "", *HEADER, *(table_line(r) for r in records)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--cases", help="comma-separated indices into CASES (default: all)")
    parser.add_argument("--staleness", default="1,2", help="comma-separated (default 1,2)")
    parser.add_argument("--speculation", default="off,das",
                        help="comma-separated: off, das (default both)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    cases = range(len(CASES)) if args.cases is None else [int(i) for i in args.cases.split(",")]
    t0 = time.time()
    records = []
    for case in cases:
        for speculation in args.speculation.split(","):
            for staleness in (int(s) for s in args.staleness.split(",")):
                records.append(run_case(case, staleness, args.steps, speculation))
                print(table_line(records[-1]), flush=True)
    text = render(records, args.steps, time.time() - t0)
    print(text)
    if not args.no_write:
        write_block(START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
