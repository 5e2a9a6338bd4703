"""Hysteresis on workloads nobody tuned it on (issue 5, criteria 2, 3 and 5): a seeded random
sweep, written to docs/results.md.

    python bench/unseen.py              # 96 runs (~5 minutes), rewrites docs/results.md
    python bench/unseen.py --runs 8     # a smoke run (prints only)
    python bench/unseen.py --staleness 0,2 --speculation das --runs 24   # issue 25's
                                        # settings, own block (<!-- unseen-s02-das:... -->)

Each run draws a workload family and its parameters, a GPU count (4-96), a staleness (0/1)
and a cost model, then simulates the best static split (searched) and `hysteresis` side by
side with the same seed:

- `tailed`: log-normal lengths, sigma 0.8-1.5, capped at 8-32k tokens (DAPO-like shapes);
- `tailless`: sigma 0.08-0.25, capped at 0.5-2k (the shape criterion 3 calls balanced);
- `bimodal`: a short tool call or a long reasoning turn per sample (agentic-like);
- `drift`: the median doubles over the run.

Reported per family: hysteresis / best static (min, median, and min over the runs the
oracle calls tail-bound) and the most resizes any run made; under the table, how many runs
fall below 1.0x the best static split (issue 19, criterion 3: none). A run whose longest
request does not fit one device's KV cache is skipped (the twin refuses it with a clear
error).
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from pathlib import Path

from dynaresize.sim.run import simulate
from dynaresize.sim.workloads import SyntheticWorkload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from acceptance import unseen_line  # noqa: E402  (bench/ is not a package)
from policies import write_block  # noqa: E402

START, END = "<!-- unseen:start -->", "<!-- unseen:end -->"
FAMILIES = ("tailed", "tailless", "bimodal", "drift")
GPU_COUNTS = (4, 6, 8, 12, 16, 24, 32, 40, 48, 64, 96)
COST_MODELS = ("h100-7b", "h200-7b", "h100-32b", "h200-32b")


def draw(rng: random.Random, family: str, steps: int) -> SyntheticWorkload:
    """One workload of `family` (module docstring), seeded from `rng`."""
    prompts, group = rng.choice([64, 128, 256, 512]), rng.choice([4, 8, 16])
    seed = rng.randrange(10**6)
    if family == "tailed":
        return SyntheticWorkload("tailed", prompts, group, rng.choice([8192, 16384, 32768]),
                                 rng.uniform(500, 3000), rng.uniform(0.8, 1.5),
                                 group_rho=rng.uniform(0.2, 0.8), seed=seed,
                                 median_prompt_tokens=rng.uniform(100, 2000))
    if family == "tailless":
        return SyntheticWorkload("tailless", prompts, group, rng.choice([512, 1024, 2048]),
                                 rng.uniform(200, 900), rng.uniform(0.08, 0.25), seed=seed,
                                 median_prompt_tokens=rng.uniform(100, 1500))
    if family == "bimodal":
        return SyntheticWorkload("bimodal", min(prompts, 256), group, 16384,
                                 rng.uniform(100, 600), rng.uniform(0.3, 0.7), group_rho=0.3,
                                 seed=seed, median_prompt_tokens=rng.uniform(1000, 6000),
                                 long_median_response_tokens=rng.uniform(2000, 8000))
    return SyntheticWorkload("drift", min(prompts, 256), group, 16384, rng.uniform(300, 1500),
                             rng.uniform(0.6, 1.2), doubling_steps=float(steps), seed=seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=96)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--staleness", default="0,1",
                        help="staleness values drawn from, comma-separated (e.g. 0,2)")
    parser.add_argument("--speculation", default="off",
                        help="off, das or a JSON histogram: every policy of every run alike")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    stalenesses = tuple(int(k) for k in args.staleness.split(","))
    rng = random.Random(args.seed)
    got: dict[str, list[tuple[float, int, str]]] = {f: [] for f in FAMILIES}
    skipped = 0
    t0 = time.time()
    for i in range(args.runs):
        family = FAMILIES[i % len(FAMILIES)]
        wl = draw(rng, family, args.steps)
        gpus, staleness = rng.choice(GPU_COUNTS), rng.choice(stalenesses)
        cost_model = rng.choice(COST_MODELS)
        tag = (f"{i:3d} {family:8s} {wl.prompts_per_step}x{wl.samples_per_prompt} median "
               f"{wl.median_response_tokens:5.0f} sigma {wl.sigma:.2f}, {gpus} GPUs, "
               f"s={staleness}, {cost_model}")
        try:
            res = simulate(wl, gpus, ("static", "hysteresis", "oracle"), steps=args.steps,
                           staleness=staleness, seed=0, cost_model=cost_model,
                           speculation=args.speculation)
        except ValueError as exc:  # e.g. a request longer than one device's KV cache
            skipped += 1
            print(f"{tag}: skipped ({exc})", flush=True)
            continue
        row = {r["policy"]: r for r in res["results"]}
        ratio = row["hysteresis"]["samples_per_s"] / row["static"]["samples_per_s"]
        resizes = row["hysteresis"]["num_resizes"]
        binds = row["oracle"]["binds"]
        got[family].append((ratio, resizes, binds))
        print(f"{tag}: {binds}, hysteresis / static {ratio:.3f}, {resizes} resizes", flush=True)
    default = (args.staleness, args.speculation) == ("0,1", "off")
    lines = ["| family | runs (tail-bound) | hyst / static, min | median | min, tail-bound runs "
             "| most resizes in a run |", "|---|---|---|---|---|---|"]
    for family in FAMILIES:
        runs = got[family]
        if runs:
            ratios = [r for r, _, _ in runs]
            tail = [r for r, _, b in runs if b == "tail-bound"]
            lines.append(f"| {family} | {len(runs)} ({len(tail)}) | {min(ratios):.3f} | "
                         f"{statistics.median(ratios):.3f} | "
                         f"{f'{min(tail):.3f}' if tail else '-'} | "
                         f"{max(k for _, k, _ in runs)} |")
    header = (f"{sum(map(len, got.values()))} random unseen runs (seed {args.seed}, "
              f"{args.steps} steps each; 4-96 GPUs, staleness "
              f"{'/'.join(map(str, stalenesses))}, speculation {Path(args.speculation).stem} "
              f"for every policy; H100/H200 x 7B/32B; "
              f"{skipped} skipped: a request longer than one device's KV cache); measured "
              f"{time.strftime('%Y-%m-%d')} on {platform.machine()}, "
              f"{time.time() - t0:.0f} s wall. Reproduce: `python bench/unseen.py"
              + ("" if default else f" --staleness {args.staleness} --speculation "
                 f"{args.speculation} --runs {args.runs} --steps {args.steps}") + "`.")
    ratios = [r for runs in got.values() for r, _, _ in runs]
    issue = "Issue 19's" if default else "Issue 25's (acceptance 4, the same settings for both)"
    table = "\n".join([header, "", *lines, "", f"{issue} acceptance: {unseen_line(ratios)}"])
    print(table)
    if not args.no_write and (args.runs == parser.get_default("runs") or not default):
        tag = "" if default else f"-s{args.staleness.replace(',', '')}-" \
            f"{Path(args.speculation).stem}"
        write_block(START.replace(":start", f"{tag}:start"), END.replace(":end", f"{tag}:end"),
                    table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
