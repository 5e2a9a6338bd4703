"""Dynamic sampling (DAPO) in the digital twin: hysteresis against the best static split and the
`reference` (the best fixed split with streaming training), with and without filtering, side by
side; writes docs/results.md between `<!-- twin-dynamic:start -->` and `<!-- twin-dynamic:end
-->`.

    python bench/dynamic_sampling.py            # the table, and rewrite that section
    python bench/dynamic_sampling.py --quick    # fewer steps (a smoke run)

Per case (workload, GPUs, B prompts x 16 samples), three runs of `static` (best split,
searched), `reference` (best split, searched with streaming on) and `hysteresis` (from
static's split), same seed:
- `plain`: GRPO, B prompts a step, no dynamic sampling;
- `ds f=0`: dynamic sampling on (a stream of 3 x B prompts) but every group has a signal;
- `ds f=0.3-0.6`: a filter rate drawn per step in [0.3, 0.6] (`FilteredWorkload`): the step
  dispatches B (1 + margin f) / (1 - f) prompts up front (f of an ended step; margin 1, and
  0 and 2 on the first case) and one more per finished
  group without a signal (live top-up), and trains B groups.
Throughput is trained samples per second (B x 16 a step in every run).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from dynaresize.core.dynamic_sampling import DynamicSampling, TopUp
from dynaresize.sim.run import simulate
from dynaresize.sim.workloads import FilteredWorkload, drawn_filter_rates, get_workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policies import write_block  # noqa: E402  (bench/ is not a package)

START, END = "<!-- twin-dynamic:start -->", "<!-- twin-dynamic:end -->"
CASES = [("dapo-7b", 32, 64), ("dapo-7b", 64, 128), ("agentic", 32, 64)]
"""(workload, GPUs, B prompts a step)."""
SAMPLES, MAX_ROUNDS, LOW, HIGH = 16, 3, 0.3, 0.6


def workloads(name: str, batch: int, steps: int, sweep: bool) -> dict[str, object]:
    """The rows of a case; `sweep`: the filtered one also with margins 0 and 2 (default 1)."""
    pool = get_workload(name, seed=0, prompts_per_step=batch * MAX_ROUNDS,
                        samples_per_prompt=SAMPLES)
    rates = drawn_filter_rates(LOW, HIGH, steps)
    rows: dict[str, object] = {
        "plain": get_workload(name, seed=0, prompts_per_step=batch, samples_per_prompt=SAMPLES),
        "ds f=0": FilteredWorkload(pool, batch, MAX_ROUNDS, 0.0),
        f"ds f={LOW}-{HIGH}": FilteredWorkload(pool, batch, MAX_ROUNDS, rates)}
    for margin in (0.0, 2.0) if sweep else ():
        rows[f"ds f={LOW}-{HIGH} margin {margin:g}"] = FilteredWorkload(
            pool, batch, MAX_ROUNDS, rates, margin=margin)
    return rows


def up_front_fillers(wl: object, batch: int, steps: int, staleness: int) -> float:
    """The share of trained groups WITHOUT a signal under the previous rule (no top-up:
    ceil(1 / (1 - f)) rounds of B up front, a shortfall filled with groups without a signal),
    replayed on the workload's signals."""
    if not isinstance(wl, FilteredWorkload):
        return 0.0
    rates: dict[int, float] = {}
    fillers = 0
    for k in range(steps):
        f = rates.get(k - 1 - staleness)
        rounds = 1 if f is None else min(MAX_ROUNDS, math.ceil(1 / (1 - f) - 1e-9))
        signal = [wl.group_has_signal(k, p) for p in range(rounds * batch)]
        fillers += max(0, batch - sum(signal))
        rates[k] = 1 - sum(signal) / len(signal)
    return fillers / (steps * batch)


def batch_sizes(wl: object, batch: int, steps: int, staleness: int
                ) -> tuple[float, float]:
    """(mean prompts dispatched up front, mean batch N) per step over B: the planner's rule
    replayed on the workload's signals (both are functions of the seed and the rewards;
    prompts dispatched beyond N depend on timing and are not counted)."""
    if not isinstance(wl, FilteredWorkload):
        return 1.0, 1.0
    plan = DynamicSampling(batch, MAX_ROUNDS, wl.margin)
    rates: dict[int, float] = {}
    ups, sizes = [], []
    for k in range(steps):
        initial = plan.initial_for(rates.get(k - 1 - staleness))
        order = list(range(plan.pool_size))
        signal = {p: wl.group_has_signal(k, p) for p in order}
        top_up, in_flight = TopUp(order, batch, initial), order[:initial]
        while in_flight:  # in order: any order gives the same batch
            in_flight += top_up.complete(in_flight[0], signal[in_flight[0]])
            in_flight.pop(0)
        n = top_up.batch_size()
        rates[k] = sum(not signal[p] for p in order[:n]) / n
        ups.append(initial / batch)
        sizes.append(n / batch)
    return sum(ups) / steps, sum(sizes) / steps


def run_case(name: str, gpus: int, batch: int, steps: int, staleness: int,
             sweep: bool) -> list[str]:
    rows = []
    for label, wl in workloads(name, batch, steps, sweep).items():
        res = simulate(wl, gpus, ("static", "reference", "hysteresis"), steps=steps,
                       staleness=staleness, seed=0)
        by = {r["policy"]: r for r in res["results"]}
        static, ref, hyst = by["static"], by["reference"], by["hysteresis"]
        split = static["split"]
        up, size = batch_sizes(wl, batch, steps, staleness)
        rows.append(f"| {name} | {gpus} | {batch}x{SAMPLES} | {label} | {up:.2f} / {size:.2f} | "
                    f"{split['rollout']}R/{split['train']}T | {static['samples_per_s']:.2f} | "
                    f"{ref['samples_per_s']:.2f} | {hyst['samples_per_s']:.2f} | "
                    f"{hyst.get('num_resizes', 0)} | "
                    f"**{hyst['samples_per_s'] / static['samples_per_s']:.3f}x** | "
                    f"{hyst['samples_per_s'] / ref['samples_per_s']:.3f}x | "
                    f"{up_front_fillers(wl, batch, steps, staleness):.1%} |")
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--cases", help="comma-separated indices into CASES (default: all)")
    args = parser.parse_args(argv)
    steps = 6 if args.quick else args.steps
    cases = range(len(CASES)) if args.cases is None else [int(i) for i in args.cases.split(",")]
    t0 = time.time()
    lines = ["| workload | GPUs | batch | sampling | up front / batch (x B) | best static | "
             "static samples/s | reference samples/s | hysteresis samples/s | resizes | "
             "hysteresis / static | hysteresis / reference | no-signal groups trained "
             "by the up-front rule |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i in cases:
        lines += run_case(*CASES[i], steps, args.staleness, sweep=i == 0)
    lines.append("")
    lines.append(f"`python bench/dynamic_sampling.py` ({steps} steps, staleness "
                 f"{args.staleness}, seed 0, cost model h100-7b; {time.time() - t0:.0f} s "
                 "of twin time on a shared 2-core machine). Filter rate per step drawn "
                 f"uniformly in [{LOW}, {HIGH}]; a stream of {MAX_ROUNDS} x B prompts, "
                 "topped up live; every run trains B groups a step.")
    table = "\n".join(lines)
    print(table)
    if not args.no_write and not args.quick:
        write_block(START, END, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
