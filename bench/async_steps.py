"""Staleness 2 against `fully-async` by run length: how much of the gap is the pipeline's fill.

bench/tail_async.py measures 8 steps. At staleness 2 the first three steps all sample version
0 and training has nothing to train until step 0's samples arrive, so a run pays its
pipeline's fill once; a short run weighs that fill more than an RL run of hundreds of steps.
This bench runs issue 25's tailed cases at staleness 2 with the same speculation settings as
bench/tail_async.py (every policy of a row alike) for `--steps` lengths and reports hysteresis,
the best fixed split with the same pipelining (`reference`) and `fully-async`, and their
ratios, into docs/results.md (between `<!-- async-steps:start -->` and `<!-- async-steps:end
-->`).

    python bench/async_steps.py                   # 8 and 20 steps
    python bench/async_steps.py --steps 8,20,40 --no-write
    python bench/async_steps.py --large           # 128-256 GPUs (`<!-- async-large:... -->`)

`--large` runs the upper half of issue 25's 32-256 GPUs (`LARGE_CASES`) at the acceptance's
two settings only, DAS's preset and vLLM's temperature-0.6 acceptance measured live, and
without `reference` (its split search at 256 GPUs would take most of the run).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

from dynaresize.sim.resolve import resolve_workload
from dynaresize.sim.run import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policies import write_block  # noqa: E402
from tail_async import CASES, speculations  # noqa: E402

START, END = "<!-- async-steps:start -->", "<!-- async-steps:end -->"
LARGE_START, LARGE_END = "<!-- async-large:start -->", "<!-- async-large:end -->"
POLICIES = ("hysteresis", "reference", "fully-async", "fully-async-keep-kv")
LARGE_POLICIES = ("hysteresis", "fully-async", "fully-async-keep-kv")
LARGE_CASES = [("dapo-7b", 128, 8192), ("agentic", 128, 4096), ("dapo-7b", 256, 16384)]
LARGE_SPECULATIONS = ("das", "spec_acceptance_vllm_t0.6")
STALENESS = 2


def run_row(case: tuple[str, int, int], speculation: str, steps: int,
            policies: tuple[str, ...] = POLICIES) -> dict[str, Any]:
    workload, gpus, requests = case
    wl = resolve_workload(workload, seed=0, requests_per_step=requests)
    out = simulate(wl, gpus, policies, steps=steps, staleness=STALENESS, seed=0,
                   requests_per_step=requests, speculation=speculation)
    thr = {r["policy"]: r["samples_per_s"] for r in out["results"]}
    name = "off" if speculation == "off" else Path(speculation).stem
    return {"workload": workload, "gpus": gpus, "requests": requests, "speculation": name,
            "steps": steps, **thr}


def line(row: dict[str, Any]) -> str:
    h, fa, kept = row["hysteresis"], row["fully-async"], row["fully-async-keep-kv"]
    ref = row.get("reference")
    refs = "" if ref is None else f" {ref:.2f} |"
    ref_ratio = "" if ref is None else f" {ref / fa:.3f} |"
    return (f"| {row['workload']} ({row['requests']} req/step) | {row['gpus']} "
            f"| {row['speculation']} | {row['steps']} | {h:.2f} |{refs} {fa:.2f} "
            f"| {h / fa:.3f} |{ref_ratio} {kept:.2f} | {h / kept:.3f} |")


def render(rows: list[dict[str, Any]], wall_s: float, large: bool = False) -> str:
    head = ("Samples/s in the twin (h100-7b), staleness 2, seed 0, every row with the same "
            "speculation" + ("" if large else "; `reference`: the best fixed split with the "
                              "same pipelining") + ". Measured "
            f"{time.strftime('%Y-%m-%d')} on {platform.machine()}, {wall_s:.0f} s wall on a "
            f"shared 2-core machine. Reproduce: `python bench/async_steps.py"
            f"{' --large' if large else ''}`. *`fully-async` "
            f"changes the RL semantics (partial rollouts mix policy versions); its requests "
            f"prefill their context again after each weight update, as AReaL's and slime's "
            f"do; **KV kept: the same with the KV kept across updates, an upper bound on the "
            f"competitor (docs/simulator.md).")
    ref_head, ref_ratio = ("", "") if large else (" reference |", " reference / fully-async |")
    header = (f"| workload | GPUs | speculation | steps | hysteresis |{ref_head} fully-async* "
              f"| hyst / fully-async |{ref_ratio} fully-async, KV kept** "
              f"| hyst / KV kept |")
    lines = [header, "|" + "---|" * (header.count("|") - 1), *(line(r) for r in rows)]
    summary = []
    for steps in sorted({r["steps"] for r in rows}):
        ratios = [r["hysteresis"] / r["fully-async"] for r in rows if r["steps"] == steps]
        summary.append(f"- {steps} steps: hysteresis / fully-async below 0.95 in "
                       f"{sum(x < 0.95 for x in ratios)} of {len(ratios)} rows "
                       f"(min {min(ratios):.3f})")
    return "\n".join([head, "", *lines, "", *summary])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="8,20", help="comma-separated run lengths")
    parser.add_argument("--cases", help="comma-separated indices into tail_async.CASES "
                        "(with --large: into LARGE_CASES)")
    parser.add_argument("--large", action="store_true",
                        help="128-256 GPUs, DAS's preset and vLLM's temperature-0.6 acceptance")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    table = LARGE_CASES if args.large else CASES
    cases = [table[int(i)] for i in args.cases.split(",")] if args.cases else table
    specs = speculations()
    if args.large:
        specs = [s for s in specs if Path(s).stem in LARGE_SPECULATIONS]
    policies = LARGE_POLICIES if args.large else POLICIES
    t0 = time.time()
    rows = []
    for case in cases:
        for speculation in specs:
            for steps in (int(s) for s in args.steps.split(",")):
                rows.append(run_row(case, speculation, steps, policies))
                print(line(rows[-1]), flush=True)
    text = render(rows, time.time() - t0, args.large)
    print(text)
    if not args.no_write:
        write_block(*((LARGE_START, LARGE_END) if args.large else (START, END)), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
