"""Issue 25 in the twin: speculative decoding, staleness 2 and the `fully-async` reference,
written to docs/results.md (between `<!-- twin-async:start -->` and `<!-- twin-async:end -->`).

    python bench/tail_async.py                 # the cases below, 8 steps
    python bench/tail_async.py --cases 0 --steps 4 --no-write

Per tailed case, speculation (off, the `das` preset, and the histograms measured live when they
exist: docs/data/spec_acceptance.json of the builtin engine, spec_acceptance_vllm_t*.json of
vLLM) and staleness (0, 2): `simulate` with
static, hysteresis, reference, fully-async and oracle (every row with the same speculation),
and one more hysteresis run at the static split with every request's submission and
completion recorded (bench/gap.py's `Recorder`, the twin's recording hook) for the tail: the
span of the last 10% of each step's requests, its share of the rollout span, and the longest
request's life against the same request alone on an empty device (with the same speculation).
Under the table, issue 25's acceptance lines (bench/acceptance.py `issue25_lines`).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from dynaresize.control.registry import POLICIES as CONTROLLERS
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import run_config, sim_config
from dynaresize.sim.oracle import oracle_steps, spec_alone_s, work_samples_per_s
from dynaresize.sim.resolve import resolve_workload
from dynaresize.sim.run import simulate
from dynaresize.sim.speculation import resolve_speculation

sys.path.insert(0, str(Path(__file__).resolve().parent))
import acceptance  # noqa: E402  (bench/ is not a package)
from gap import Recorder, Requests  # noqa: E402
from policies import write_block  # noqa: E402

START, END = "<!-- twin-async:start -->", "<!-- twin-async:end -->"
CALIBRATED = Path(__file__).resolve().parent.parent / "docs" / "data" / "spec_acceptance.json"
CASES = [("dapo-7b", 32, 2048), ("agentic", 32, 1024), ("dapo-7b", 64, 4096)]
POLICIES = ("static", "hysteresis", "reference", "fully-async", "fully-async-keep-kv",
            "oracle")
STALENESS = (0, 2)


def speculations() -> list[str]:
    """off, the DAS-sized preset, and each histogram measured live: the builtin engine's
    (docs/data/spec_acceptance.json) and vLLM's per temperature
    (docs/data/spec_acceptance_vllm_t*.json, bench/speculative_vllm.py)."""
    measured = sorted(CALIBRATED.parent.glob("spec_acceptance_vllm_t*.json"))
    return ["off", "das"] + ([str(CALIBRATED)] if CALIBRATED.is_file() else []) + \
        [str(p) for p in measured]


def tail_of(workload: Any, gpus: int, split: int, steps: int, staleness: int,
            speculation: str) -> dict[str, float]:
    """hysteresis at `split`, every request recorded: the tail measures (module doc)."""
    costs = get_cost_model("h100-7b")
    spec = resolve_speculation(speculation)
    if spec is not None:
        costs = replace(costs, speculation=spec)
    cfg = sim_config(workload, split, gpus - split, steps, staleness, 0, costs)
    cfg.controller.policy = "hysteresis"
    log = Requests()
    run_config(cfg, workload, costs, CONTROLLERS["hysteresis"](cfg), recorder=Recorder(log))
    shares, tails, lives = [], [], []
    for k in range(steps):
        keys = [key for key in log.finished if key[0] == k]
        ends = sorted(log.finished[key][0] for key in keys)
        start_s = min(log.submitted[key] for key in keys)
        tail_s = ends[-1] - ends[int(0.9 * (len(ends) - 1))]
        tails.append(tail_s)
        shares.append(tail_s / (ends[-1] - start_s))
        longest = max(keys, key=lambda key: log.finished[key][1::-1])
        req = workload.step_requests(k)
        prompt = int(req.prompt_tokens[longest[1]])
        length = log.finished[longest][1]
        alone_s = float(costs.decode_span_s(length, 1, prompt) + costs.prefill_s(prompt))
        if spec is not None:
            alone_s = min(alone_s, float(spec_alone_s(costs, req)[longest[1], longest[2]])
                          + costs.prefill_s(prompt))
        lives.append((log.finished[longest][0] - log.submitted[longest]) / alone_s)
    return {"tail_s": statistics.mean(tails), "tail_share": statistics.mean(shares),
            "longest_over_alone": statistics.mean(lives)}


def run_case(case: int, speculation: str, staleness: int, steps: int) -> dict[str, Any]:
    workload, gpus, requests = CASES[case]
    wl = resolve_workload(workload, seed=0, requests_per_step=requests)
    out = simulate(wl, gpus, POLICIES, steps=steps, staleness=staleness, seed=0,
                   requests_per_step=requests, speculation=speculation)
    static = next(r for r in out["results"] if r["policy"] == "static")
    oracle = next(r for r in out["results"] if r["policy"] == "oracle")
    costs = get_cost_model("h100-7b")
    spec = resolve_speculation(speculation)
    if spec is not None:
        costs = replace(costs, speculation=spec)
    oracle["work_samples_per_s"] = work_samples_per_s(
        oracle_steps(costs, wl, gpus, steps, staleness))
    tail = tail_of(wl, gpus, static["split"]["rollout"], steps, staleness, speculation)
    name = "off" if speculation == "off" else Path(speculation).stem
    return {"case": case, "workload": workload, "gpus": gpus, "requests": requests,
            "speculation": name, "staleness": staleness, "out": out, "tail": tail}


def table_line(rec: dict[str, Any]) -> str:
    rows = {r["policy"]: r for r in rec["out"]["results"]}
    thr = {p: rows[p]["samples_per_s"] for p in POLICIES}
    hyst = rows["hysteresis"]
    tail = rec["tail"]
    acc = hyst.get("accepted_per_iteration")
    return (f"| {rec['workload']} ({rec['requests']} req/step) | {rec['gpus']} "
            f"| {rec['speculation']} | {rec['staleness']} | {thr['static']:.2f} "
            f"| {thr['hysteresis']:.2f} | {thr['reference']:.2f} | {thr['fully-async']:.2f} "
            f"| {thr['fully-async-keep-kv']:.2f} "
            f"| {thr['oracle']:.2f} | {rows['oracle']['work_samples_per_s']:.2f} "
            f"| {thr['hysteresis'] / thr['fully-async']:.3f} "
            f"| {thr['hysteresis'] / thr['fully-async-keep-kv']:.3f} "
            f"| {thr['hysteresis'] / rows['oracle']['work_samples_per_s']:.3f} "
            f"| {'-' if acc is None else f'{acc:.2f}'} | {tail['tail_s']:.1f} "
            f"| {tail['tail_share']:.0%} | {tail['longest_over_alone']:.2f} "
            f"| {rows['fully-async']['mixed_version_share']:.1%} |")


HEADER = ["| workload | GPUs | speculation | s | static | hysteresis | reference "
          "| fully-async* | fully-async, KV kept** | oracle | oracle work bound "
          "| hyst / fully-async | hyst / KV kept | hyst / work bound | accepted / iter (hyst) "
          "| tail s (last 10%) | tail share | longest / alone "
          "| fully-async samples mixing versions |",
          "|" + "---|" * 19]


def render(records: list[dict[str, Any]], steps: int, wall_s: float) -> str:
    head = (f"Samples/s in the twin (h100-7b), {steps} steps, seed 0, every row of a line with "
            f"the same speculation; the tail columns from a recorded hysteresis run at the "
            f"static split. Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, "
            f"{wall_s:.0f} s wall on a shared 2-core machine. Reproduce: "
            f"`python bench/tail_async.py`. *`fully-async` changes the RL semantics (partial "
            f"rollouts mix policy versions; groups trained in completion order): a competitor's "
            f"configuration at the same staleness bound, not ours; its requests prefill their "
            f"context again after each weight update, as AReaL's and slime's do. **The same "
            f"with the KV kept across updates: an upper bound on the competitor, not a "
            f"configuration it runs (docs/simulator.md).")
    return "\n".join([head, "", *HEADER, *(table_line(r) for r in records), "",
                      "Issue 25's acceptance (`bench/acceptance.py`), from this table:", "",
                      *(f"- {line}" for line in acceptance.issue25_lines(records))])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--cases", help="comma-separated indices into CASES (default: all)")
    parser.add_argument("--only", metavar="SPEC:S", help="one (speculation, staleness), e.g. "
                        "das:2 (with --out, for --render of several files)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--out", help="also write the records to this JSON file")
    parser.add_argument("--render", nargs="+", metavar="JSON|WALL_S", help="simulate "
                        "nothing: the section from --out files (the last value: the runs' "
                        "wall seconds)")
    args = parser.parse_args(argv)
    if args.render:
        records = [r for path in args.render[:-1] for r in json.loads(Path(path).read_text())]
        records.sort(key=lambda r: (r["case"], r["speculation"] != "off", r["staleness"]))
        text = render(records, args.steps, float(args.render[-1]))
        print(text)
        if not args.no_write:
            write_block(START, END, text)
        return 0
    cases = range(len(CASES)) if args.cases is None else [int(i) for i in args.cases.split(",")]
    t0 = time.time()
    records = []
    for case in cases:
        for speculation in speculations():
            for staleness in STALENESS:
                if args.only and args.only != f"{Path(speculation).stem}:{staleness}":
                    continue
                records.append(run_case(case, speculation, staleness, args.steps))
                print(table_line(records[-1]), flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(records))
    text = render(records, args.steps, time.time() - t0)
    print(text)
    if not args.no_write:
        write_block(START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
