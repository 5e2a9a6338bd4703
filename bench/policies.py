"""Reproduce the policy comparison table (issues 5, 19) in the digital twin and write it to
docs/results.md (between `<!-- twin-policies:start -->` and `<!-- twin-policies:end -->`).

    python bench/policies.py            # prints the table and rewrites that section
    python bench/policies.py --quick    # fewer steps and requests (a smoke run)
    python bench/policies.py --staleness 2,0 --speculation das --cases 1 --no-write
                                        # issue 25's settings (bench/tail_async.py: its table)

In two processes (each writes its rows, then one merges them into the section):

    python bench/policies.py --cases 0,1,2,3,4 --out a.json &
    python bench/policies.py --cases 5,6,7,8,9 --extras --out b.json
    python bench/policies.py --merge a.json b.json

Every policy runs on the same workload with the same seed; the `static` row is the best split
in hindsight (searched), `reference` the best fixed split with streaming training and
pipelined rollouts (what users could configure by hand, searched), `oracle` the clairvoyant
lower bound. `hysteresis` starts from the static row's split; the last column runs it again
from half and half (N/2 rollout devices), what a user gets without any search. Ratios are
measured side by side in one run. Under the table: issue 19's
acceptance criteria, each with its target (bench/acceptance.py), and what the split searches
cost.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

from dynaresize.core.rundir import read_jsonl
from dynaresize.sim.run import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import acceptance  # noqa: E402  (bench/ is not a package)

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results.md"
START, END = "<!-- twin-policies:start -->", "<!-- twin-policies:end -->"
CASES = [  # (workload, gpus, requests per step): work-bound first, then tail-bound ones
    ("dapo-7b", 16, 8192), ("dapo-7b", 32, 8192), ("dapo-7b", 64, 8192),
    ("dapo-7b", 64, 4096), ("dapo-7b", 256, 65536), ("drift", 32, 2048),
    ("agentic", 32, 1024), ("agentic", 64, 8192), ("balanced", 16, 1024),
    ("balanced", 32, 8192),
]
BIG_REQUEST_STEPS = 10
"""Cases of over 10^4 requests per step (4096 prompts x 16 samples) run this many steps (the
twin's cost is linear in requests x steps; 20 steps would double the table's wall time)."""
POLICIES = ("static", "colocated", "borrow", "hysteresis", "reference", "oracle")
UNSEEN = [  # (workload, gpus, requests, seed): seeds and GPU counts the controller was not
    # tuned on, small (work-bound) and large (tail-bound) for their batch
    ("dapo-7b", 24, 4096, 7), ("dapo-7b", 96, 4096, 11), ("agentic", 12, 512, 5),
    ("agentic", 48, 512, 13), ("drift", 20, 2048, 3), ("balanced", 24, 1024, 9),
]


def drift_second_half(steps: int, staleness: int) -> str:
    """`drift` (median doubling every 25 steps) on 32 GPUs: hysteresis vs the best static
    split over the second half of the run, where the mean length has grown most."""
    with tempfile.TemporaryDirectory() as out:
        simulate("drift", 32, ("static", "hysteresis"), steps=steps, staleness=staleness,
                 seed=0, requests_per_step=2048, out_dir=out)
        half = {p: sum(m["step_s"] for m in read_jsonl(Path(out) / p / "metrics.jsonl")
                       if m["step"] >= steps // 2) for p in ("static", "hysteresis")}
    return (f"drift, 32 GPUs, {steps} steps, s={staleness}: second half "
            f"{half['static'] / half['hysteresis']:.2f}x the best static split")


def unseen_line(steps: int) -> str:
    """hysteresis / best static on `UNSEEN`, both staleness values."""
    ratios = []
    for workload, gpus, requests, seed in UNSEEN:
        for staleness in (1, 0):
            res = simulate(workload, gpus, ("static", "hysteresis"), steps=steps,
                           staleness=staleness, seed=seed, requests_per_step=requests)
            thr = {r["policy"]: r["samples_per_s"] for r in res["results"]}
            ratios.append(thr["hysteresis"] / thr["static"])
            print(f"  unseen {workload} {gpus} GPUs seed {seed} s={staleness}: "
                  f"{ratios[-1]:.3f}", flush=True)
    return (f"unseen seeds and GPU counts ({len(ratios)} runs: "
            f"{', '.join(f'{w} {g} GPUs' for w, g, _, _ in UNSEEN)}; both staleness values): "
            f"hysteresis / best static {min(ratios):.2f}–{max(ratios):.2f}x; "
            f"{acceptance.unseen_line(ratios)}")


def block_markers(name: str) -> tuple[str, str]:
    """The start and end markers of the results block `name` (`write_block`)."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def write_block(start: str, end: str, text: str, path: Path = RESULTS) -> None:
    """Replace `path`'s text between the `start` and `end` markers; append the markers (and
    create the file, titled) where they are missing."""
    doc = path.read_text() if path.exists() else "# Results\n"
    if start not in doc or end not in doc:
        doc = doc.rstrip("\n") + f"\n\n{start}\n{end}\n"
    doc = re.sub(re.escape(start) + ".*?" + re.escape(end),
                 lambda _: f"{start}\n{text}\n{end}", doc, flags=re.S)
    path.write_text(doc)


def row_of(results: list[dict], policy: str) -> dict | None:
    return next((r for r in results if r["policy"] == policy), None)


def _split(row: dict) -> str:
    split = row.get("split") or {}
    return f"{split.get('rollout')}R/{split.get('train')}T"


def table_line(record: dict, steps: int) -> str:
    """One markdown row of the table from a record (`run_case`)."""
    out, workload, requests = record["out"], record["workload"], record["requests"]
    case_steps = record["case_steps"]
    res = out["results"]
    thr = {p: (row_of(res, p) or {}).get("samples_per_s", float("nan")) for p in POLICIES}
    hyst = row_of(res, "hysteresis") or {}
    churn = out.get("churn") or {}
    steps_note = f", {case_steps} steps" if case_steps != steps else ""

    def ratio(p: str) -> str:
        return f"{thr['hysteresis'] / thr[p]:.3f}" if thr[p] > 0 else "-"
    saved = churn.get("saved_s_per_step")
    half = (out.get("hysteresis_from_half") or {}).get("samples_per_s")
    half_cell = "-" if not half else f"{half:.2f} ({half / thr['hysteresis']:.2f})"
    return (f"| {workload} ({requests} req/step{steps_note}) | {out['gpus']} "
            f"| {out['staleness']} | {(row_of(res, 'oracle') or {}).get('binds', '?')} "
            f"| {thr['static']:.2f} ({_split(row_of(res, 'static') or {})}) "
            f"| {thr['colocated']:.2f} | {thr['borrow']:.2f} | {thr['hysteresis']:.2f} "
            f"| {thr['reference']:.2f} ({_split(row_of(res, 'reference') or {})}) "
            f"| {thr['oracle']:.2f} | {ratio('static')} | {ratio('colocated')} "
            f"| {ratio('reference')} | {ratio('oracle')} "
            f"| {hyst.get('resizes_per_step', 0):.2f} | {hyst.get('resize_s_per_step', 0):.1f} "
            f"| {'-' if saved is None else f'{saved:.1f}'} | {half_cell} |")


HEADER = ["| workload | GPUs | s | oracle binds | static (split) | colocated | borrow "
          "| hysteresis | reference (split) | oracle | hyst / static | hyst / colocated "
          "| hyst / reference | hyst / oracle | resizes / step | resize s / step "
          "| saved s / step vs reference | hysteresis from N/2 (/ hysteresis) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]


def run_case(case: int, staleness: int, steps: int, quick: bool = False,
             speculation: str = "off") -> dict:
    """One row: every policy of `POLICIES` on `CASES[case]`, with what its split searches
    cost (`quick`: at most 512 requests per step)."""
    workload, gpus, requests = CASES[case]
    requests = min(requests, 512) if quick else requests
    case_steps = min(steps, BIG_REQUEST_STEPS) if requests > 10**4 else steps
    timings: dict[str, tuple[float, float]] = {}
    out = simulate(workload, gpus, POLICIES, steps=case_steps, staleness=staleness, seed=0,
                   requests_per_step=requests, timings=timings, speculation=speculation)
    # what a user gets without searching: the controller started from half and half
    half = simulate(workload, gpus, ("hysteresis",), steps=case_steps, staleness=staleness,
                    seed=0, requests_per_step=requests, split=gpus // 2,
                    speculation=speculation)["results"][0]
    out["hysteresis_from_half"] = {k: half.get(k) for k in
                                   ("samples_per_s", "resizes_per_step", "mean_rollout_devices")}
    tried = sum((row_of(out["results"], p) or {}).get("num_splits_tried", 0)
                for p in ("static", "reference"))
    search_s = sum(timings.get(k, (0.0, 0.0))[0] for k in ("search", "reference-search"))
    return {"case": case, "workload": workload, "requests": requests, "case_steps": case_steps,
            "splits_tried": tried, "search_s": round(search_s, 1), "out": out}


def case_order(record: dict) -> tuple[int, int]:
    """Where a record's row sits in the table: CASES order, staleness 1 before 0."""
    return record["case"], -record["out"]["staleness"]


def merge(paths: list[str]) -> dict:
    """The records, extra lines and wall seconds of `--out` files, in table order (a case in
    two files: the later file's row)."""
    rows: dict[tuple, dict] = {}
    merged: dict = {"steps": None, "extra": [], "wall_s": 0.0}
    for path in paths:
        part = json.loads(Path(path).read_text())
        merged["steps"] = merged["steps"] or part["steps"]
        merged["extra"] += part["extra"]
        merged["wall_s"] = max(merged["wall_s"], part["wall_s"])
        for rec in part["records"]:
            rows[case_order(rec)] = rec
    merged["records"] = sorted(rows.values(), key=case_order)
    return merged


def render(records: list[dict], extra: list[str], steps: int, wall_s: float,
           processes: int = 1) -> str:
    """The section: a header, the table, the extra lines, the acceptance lines."""
    tried = sum(r.get("splits_tried", 0) for r in records)
    search_s = sum(r.get("search_s", 0.0) for r in records)
    header = (f"Samples/s in the twin (h100-7b cost model), {steps} steps "
              f"({BIG_REQUEST_STEPS} for over 10^4 requests/step), seed 0; measured "
              f"{time.strftime('%Y-%m-%d')} on {platform.machine()} "
              f"({platform.processor() or 'CPU'}), {wall_s:.0f} s wall"
              f"{f' in {processes} processes' if processes > 1 else ''}; the split searches "
              f"(`static`, `reference`) simulated {tried} probes in {search_s:.0f} s. "
              f"Reproduce: `python bench/policies.py`.")
    extra_lines = [*(f"- {line}" for line in extra), ""] if extra else []
    return "\n".join([header, "", *HEADER, *(table_line(r, steps) for r in records), "",
                      *extra_lines,
                      "Issue 19's acceptance (`bench/acceptance.py`), from this table:", "",
                      *(f"- {line}" for line in acceptance.acceptance_lines(records))])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--staleness", default="1,0", help="staleness values, comma-separated "
                        "(e.g. 2,0; not the default: implies --no-write)")
    parser.add_argument("--speculation", default="off", help="off, das or a JSON histogram, "
                        "for every policy alike (not off: implies --no-write)")
    parser.add_argument("--cases", help="comma-separated indices into CASES (default: all); "
                        "implies --no-write and skips the extra lines unless --extras")
    parser.add_argument("--extras", action="store_true",
                        help="with --cases: run the extra lines (drift halves, unseen) too")
    parser.add_argument("--out", help="also write the rows and extra lines to this JSON file "
                        "(for --merge)")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="simulate nothing: build "
                        "the section from --out files and write it (unless --no-write)")
    args = parser.parse_args(argv)
    if args.merge:
        got = merge(args.merge)
        table = render(got["records"], got["extra"], got["steps"], got["wall_s"],
                       len(args.merge))
        print(table)
        if not args.no_write:
            write_block(START, END, table)
        return 0
    cases = (range(len(CASES)) if args.cases is None else
             [int(i) for i in args.cases.split(",")])
    steps = 6 if args.quick else args.steps
    t0 = time.time()
    records = []
    stalenesses = [int(k) for k in args.staleness.split(",")]
    default = (args.staleness, args.speculation) == ("1,0", "off")
    for case in cases:
        for staleness in stalenesses:
            records.append(run_case(case, staleness, steps, args.quick, args.speculation))
            print(table_line(records[-1], steps), flush=True)
    run_extra = not args.quick and (args.cases is None or args.extras) and default
    extra = [drift_second_half(40, 1), drift_second_half(40, 0),
             unseen_line(steps)] if run_extra else []
    for line in extra:
        print(line, flush=True)
    table = render(records, extra, steps, time.time() - t0)
    print(table)
    if args.out:
        Path(args.out).write_text(json.dumps({"steps": steps, "extra": extra,
                                              "wall_s": round(time.time() - t0),
                                              "records": records}))
    if not args.no_write and not args.quick and not args.cases and default:
        write_block(START, END, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
