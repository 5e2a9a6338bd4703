"""Wall time of the digital twin versus requests x steps (the scaling table of README).

    python bench/sim_scaling.py            # the table: one orchestrator run per cell
    python bench/sim_scaling.py --full     # also every policy at 1024 GPUs, 8192 x 50

Each cell runs the unchanged orchestrator on 1024 SimDevices (dapo-7b, h100-7b, static split
at 7/8 rollout) for `steps` steps of `requests` requests, on one core, and prints wall
and CPU seconds (on a shared machine CPU time is what one dedicated core would take) and CPU
microseconds per request-step (flat = linear in requests x steps).
"""

from __future__ import annotations

import argparse
import time

from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.run import run_static, simulate
from dynaresize.sim.workloads import get_workload

GPUS = 1024


def cell_s(requests: int, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one static run of `steps` steps of `requests` requests."""
    wl = get_workload("dapo-7b", requests_per_step=requests)
    costs = get_cost_model("h100-7b")
    t0, c0 = time.perf_counter(), time.process_time()
    run_static(wl, GPUS, GPUS * 7 // 8, steps, 1, 0, costs)
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also time every policy at "
                        "1024 GPUs x 8192 requests x 50 steps")
    args = parser.parse_args()
    print("| requests/step | steps | requests x steps | wall s | CPU s | µs CPU per request-step |")
    print("|---|---|---|---|---|---|")
    for requests, steps in ((1024, 10), (2048, 10), (4096, 10), (8192, 10), (8192, 20),
                            (8192, 50), (16384, 10)):
        wall_s, cpu_s = cell_s(requests, steps)
        print(f"| {requests} | {steps} | {requests * steps} | {wall_s:.2f} | {cpu_s:.2f} | "
              f"{1e6 * cpu_s / (requests * steps):.1f} |", flush=True)
    if args.full:
        wl = get_workload("dapo-7b", requests_per_step=8192)
        t0, c0 = time.perf_counter(), time.process_time()
        out = simulate(wl, GPUS, steps=50)
        total_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        for r in out["results"]:
            print(f"{r['policy']:10s} split {r['split']} mean step {r['mean_step_s']:.1f} s "
                  f"p99 {r['p99_step_s']:.1f} s bubble {r['bubble_fraction']:.1%} "
                  f"resizes {r['num_resizes']}")
        print(f"all policies: {total_s:.1f} s wall, {cpu_s:.1f} s CPU")


if __name__ == "__main__":
    main()
