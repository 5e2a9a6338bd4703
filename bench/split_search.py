"""The static split search before and after issue 19, side by side: best split, samples/s of
a full run there, splits simulated and wall seconds of the search, for `static` and
`reference` (the `fixed` policy) on the large-batch cases of bench/policies.py.

    python bench/split_search.py                 # 5 cases x 2 staleness x 2 rows (~35 min)
    python bench/split_search.py --cases 1 --no-write

writes docs/results.md between `<!-- split-search:start -->` and `<!-- split-search:end -->`
(all cases only).

`old` is the search as it was (a 2-step probe around the closed-form optimum, +-1 step of
N/32 halving to N/128, stopping even where the best lay at the edge of what it probed),
kept here only for this comparison; `new` is `sim/run.py`'s `search_split`.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dynaresize.sim.costs import CostModel, get_cost_model
from dynaresize.sim.harness import StepSubset
from dynaresize.sim.probes import Analytic
from dynaresize.sim.resolve import resolve_workload
from dynaresize.sim.run import run_policy, run_static, search_split
from dynaresize.sim.workloads import Workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policies import BIG_REQUEST_STEPS, write_block  # noqa: E402  (bench/ is not a package)

START, END = "<!-- split-search:start -->", "<!-- split-search:end -->"
CASES = [("dapo-7b", 32, 8192), ("dapo-7b", 64, 8192), ("agentic", 64, 8192),
         ("balanced", 32, 8192), ("dapo-7b", 256, 65536)]


def old_search(workload: Workload, gpus: int, steps: int, staleness: int, seed: int,
               costs: CostModel, policy: str) -> tuple[int, int]:
    """`search_split` as of commit af3f361."""
    picked = sorted({int(k) for k in np.linspace(0, steps - 1, min(steps, 2))})
    probe = StepSubset(workload, picked)
    analytic = Analytic(costs, workload, picked)
    best = min(range(1, gpus), key=lambda r: analytic(gpus, r, staleness))
    scores: dict[int, float] = {}

    def score(r: int) -> float:
        if r not in scores:
            scores[r] = run(policy, probe, gpus, r, len(picked), staleness, seed,
                            costs)["mean_step_s"]
        return scores[r]

    spacing, finest = max(1, gpus // 32), max(1, gpus // 128)
    while True:
        best = min((r for r in (best - spacing, best, best + spacing) if 1 <= r < gpus),
                   key=lambda r: (score(r), r))
        if spacing <= finest:
            return best, len(scores)
        spacing = max(finest, spacing // 2)


def run(policy: str, workload: Workload, gpus: int, num_rollout: int, steps: int,
        staleness: int, seed: int, costs: CostModel) -> dict:
    if policy == "static":
        return run_static(workload, gpus, num_rollout, steps, staleness, seed, costs)
    return run_policy(policy, workload, gpus, num_rollout, steps, staleness, seed, costs)


def timed(search: Callable[..., tuple[int, int]], *args: object,
          **kwargs: object) -> tuple[int, int, float]:
    """(best split, splits simulated, wall s) of one search."""
    t0 = time.perf_counter()
    best, tried = search(*args, **kwargs)
    return best, tried, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps of the final runs")
    parser.add_argument("--search-steps", type=int, default=20,
                        help="the run length the search probes (bench/policies.py's)")
    parser.add_argument("--cases", help="comma-separated indices into CASES (default: all); "
                        "implies --no-write")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    cases = CASES if args.cases is None else [CASES[int(i)] for i in args.cases.split(",")]
    costs = get_cost_model("h100-7b")
    lines = ["| workload (requests/step) | GPUs | s | row | old split | old samples/s "
             "| old: splits simulated, wall s | new split | new samples/s "
             "| new: splits simulated, wall s | new / old |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    t0 = time.time()
    for name, gpus, requests in cases:
        wl = resolve_workload(name, seed=0, requests_per_step=requests)
        search_steps = (min(args.search_steps, BIG_REQUEST_STEPS) if requests > 10**4
                        else args.search_steps)
        for staleness in (1, 0):
            for row, policy in (("static", "static"), ("reference", "fixed")):
                old = timed(old_search, wl, gpus, search_steps, staleness, 0, costs,
                            policy)
                new = timed(search_split, wl, gpus, search_steps, staleness, 0, costs,
                            policy=policy)
                thr = {r: run(policy, wl, gpus, r, args.steps, staleness, 0,
                              costs)["samples_per_s"] for r in {old[0], new[0]}}
                lines.append(f"| {name} ({requests}) | {gpus} | {staleness} | {row} "
                             f"| {old[0]}R/{gpus - old[0]}T | {thr[old[0]]:.2f} "
                             f"| {old[1]}, {old[2]:.0f} | {new[0]}R/{gpus - new[0]}T "
                             f"| {thr[new[0]]:.2f} | {new[1]}, {new[2]:.0f} "
                             f"| {thr[new[0]] / thr[old[0]]:.3f} |")
                print(lines[-1], flush=True)
    header = (f"`static` (no streaming) and `reference` (the `fixed` policy) at the split each "
              f"search returns: samples/s of a {args.steps}-step run there (h100-7b, seed 0; "
              f"the searches probe a {args.search_steps}-step run ({BIG_REQUEST_STEPS} over "
              f"10^4 requests/step), as bench/policies.py's); "
              f"measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, "
              f"{time.time() - t0:.0f} s wall. Reproduce: `python bench/split_search.py`.")
    table = "\n".join([header, "", *lines])
    print(table)
    if not args.no_write and not args.cases:
        write_block(START, END, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
