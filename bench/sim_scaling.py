"""Wall time of the digital twin versus requests x steps (the scaling table of README).

    python bench/sim_scaling.py            # the table: one orchestrator run per cell
    python bench/sim_scaling.py --full     # also every policy at 1024 GPUs, 8192 x 50,
                                           # staleness 1 and 0 (issue 29: under 60 s)
    python bench/sim_scaling.py --no-table --huge --staleness 1
                                           # every policy at 8192 GPUs, 65536 x 20
                                           # (issue 29: under 10 minutes)

Each cell runs the unchanged orchestrator on 1024 SimDevices (dapo-7b, h100-7b, static split
at 7/8 rollout) for `steps` steps of `requests` requests, on one core, and prints wall
and CPU seconds (on a shared machine CPU time is what one dedicated core would take) and CPU
microseconds per request-step (flat = linear in requests x steps). `--full` / `--huge` run
`simulate` (every default policy; the static and reference splits searched; probes and
policies in as many processes as there are usable cores, `--workers` to change it) and print
each policy's results and what it cost, the split searches separately and their share of
the whole, as markdown tables, with the machine's cores and load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.forkmap import usable_cores
from dynaresize.sim.run import run_static, simulate
from dynaresize.sim.workloads import get_workload

GPUS = 1024
CELLS = ((1024, 10), (2048, 10), (4096, 10), (8192, 10), (8192, 20), (8192, 50), (16384, 10),
         (16384, 25))


def cell_s(requests: int, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one static run of `steps` steps of `requests` requests."""
    wl = get_workload("dapo-7b", requests_per_step=requests)
    costs = get_cost_model("h100-7b")
    t0, c0 = time.perf_counter(), time.process_time()
    run_static(wl, GPUS, GPUS * 7 // 8, steps, 1, 0, costs)
    return time.perf_counter() - t0, time.process_time() - c0


def full(staleness: int, gpus: int = GPUS, requests: int = 8192, steps: int = 50,
         workers: int | None = None) -> None:
    """Every default policy at `gpus` GPUs x `requests` requests x `steps` steps."""
    wl = get_workload("dapo-7b", requests_per_step=requests)
    timings: dict[str, tuple[float, float]] = {}
    load = os.getloadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, c0 = time.perf_counter(), time.process_time()
    out = simulate(wl, gpus, steps=steps, staleness=staleness, timings=timings,
                   workers=workers)
    total_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    children_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(f"\nstaleness {staleness}: {gpus} GPUs x {requests} requests x {steps} steps; "
          f"{usable_cores()} usable cores, workers {workers or 'default'}, load average "
          f"{load[0]:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print("| policy | split R/T | mean step s | p99 step s | bubble | resizes | splits simulated "
          "| wall s | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    search_s = 0.0
    for name in ("search", "reference-search"):
        if name in timings:
            wall, cpu = timings[name]
            search_s += wall
            print(f"| ({name}) | – | – | – | – | – | – | {wall:.1f} | {cpu:.1f} (here) |")
    for r in out["results"]:
        split = f"{r['split']['rollout']}/{r['split']['train']}" if r["split"] else "–"
        wall, cpu = timings[r["policy"]]
        print(f"| {r['policy']} | {split} | {r['mean_step_s']:.1f} | {r['p99_step_s']:.1f} | "
              f"{r['bubble_fraction']:.1%} | {r['num_resizes']} | "
              f"{r.get('num_splits_tried', '–')} | {wall:.1f} | {cpu:.1f} |")
    print(f"| **all policies** | | | | | | | **{total_s:.1f}** | **{cpu_s:.1f}** here + "
          f"{children_s:.1f} in worker processes |")
    print(f"\nsplit searches: {search_s:.1f} s of {total_s:.1f} s wall "
          f"({search_s / total_s:.0%})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also time every policy at "
                        "1024 GPUs x 8192 requests x 50 steps")
    parser.add_argument("--staleness", type=int, nargs="*", default=[1, 0],
                        help="staleness values for --full (default: 1 0)")
    parser.add_argument("--huge", action="store_true", help="also time every policy at "
                        "8192 GPUs x 65536 requests x 20 steps")
    parser.add_argument("--workers", type=int, help="processes for simulate (default: the "
                        "usable cores)")
    parser.add_argument("--no-table", action="store_true", help="skip the scaling table")
    args = parser.parse_args()
    if not args.no_table:
        print("| requests/step | steps | requests x steps | wall s | CPU s | "
              "µs CPU per request-step |")
        print("|---|---|---|---|---|---|")
        for requests, steps in CELLS:
            wall_s, cpu_s = cell_s(requests, steps)
            print(f"| {requests} | {steps} | {requests * steps} | {wall_s:.2f} | {cpu_s:.2f} | "
                  f"{1e6 * cpu_s / (requests * steps):.1f} |", flush=True)
    if args.full:
        for staleness in args.staleness:
            full(staleness, workers=args.workers)
    if args.huge:
        for staleness in args.staleness:
            full(staleness, 8192, 65536, 20, workers=args.workers)


if __name__ == "__main__":
    main()
