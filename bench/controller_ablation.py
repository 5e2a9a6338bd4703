"""Ablate the hysteresis controller's rules in the twin (docs/controller.md, "The rules").

    python bench/controller_ablation.py                    # every rule, 11 cases (~15 min)
    python bench/controller_ablation.py --rules band0,trust --cases dapo32s0,dapo128s1

Each rule is disabled by a local patch (one line or constant) of a copy of `src/`; the copy
runs `hysteresis` from the same start split (the best static split, searched once per case
with the unpatched code) with the same seed, in a subprocess. A patch that no longer applies
exactly once fails loudly: update it with the code. Prints a markdown table of the change in
samples/s against the unpatched code (resizes in brackets where they change).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
H = "dynaresize/control/hysteresis/"
C, M, L, S = H + "controller.py", H + "model.py", H + "lend.py", H + "split.py"
W = "dynaresize/control/rollout_width.py"

CASES = {  # name: (workload, GPUs, requests per step, steps, staleness)
    "dapo32s0": ("dapo-7b", 32, 8192, 10, 0), "dapo32s1": ("dapo-7b", 32, 8192, 10, 1),
    "agent32s1": ("agentic", 32, 1024, 20, 1), "agent32s0": ("agentic", 32, 1024, 20, 0),
    "bal16s0": ("balanced", 16, 1024, 20, 0), "bal16s1": ("balanced", 16, 1024, 20, 1),
    "bal32s0": ("balanced", 32, 8192, 10, 0), "drift32s1": ("drift", 32, 2048, 20, 1),
    "dapo128s0": ("dapo-7b", 128, 8192, 10, 0), "dapo128s1": ("dapo-7b", 128, 8192, 10, 1),
    "agent64s0": ("agentic", 64, 8192, 10, 0),
}

RULES: dict[str, list[tuple[str, str, str]]] = {  # name: [(file, old, new)]
    "none": [],
    "band0": [(C, "band=c.band,", "band=0.0,")],
    "dwell0": [(C, "min_dwell_steps=c.min_dwell_steps,", "min_dwell_steps=0,")],
    "modechange": [(C, "or lend_changed)", ")")],
    "costgate": [(C, "or gain_s * self.p.horizon_steps <= self.p.cost_margin * model.cost_s):",
                  "):")],
    "trust": [(S, "TRUST_FACTOR = 2\n", "TRUST_FACTOR = 1000\n")],
    "first_move": [(C, "FIRST_MOVE_BANDS = 1.5\n", "FIRST_MOVE_BANDS = 1.0\n")],
    "ema1": [(M, "ema: float = 0.5", "ema: float = 1.0")],
    "widthfit": [(W, "self.slope = width_slope(self.samples, self.slope) if fit else 0.0",
                  "self.slope = 0.0")],
    "pipelined_model": [(M, "if staleness and self.pipelined and self.roll_dev_s is not None:",
                         "if False:")],
    "ready_profile": [(M, "        if self.ready_profile:\n            done =",
                       "        if False:\n            done =")],
    "s0_stream_model": [(M, "if staleness == 0 and self.streams_training:", "if False:")],
    "lend_all": [(C, "release_tail=c.release_tail,", "release_tail=False,")],
    "lend_cv": [(C, "lend_min_cv=c.lend_min_cv", "lend_min_cv=0.0")],
    "pays_band": [(L, "return best_lend < (1 - self.p.band) * best_keep",
                   "return best_lend < best_keep")],
    "lend_end": [(L, "        r = len(view.allocation.rollout)\n        if (r <= 1",
                  "        r = len(view.allocation.rollout)\n        if (True or r <= 1")],
    "lend_gate": [(L, "if gain_s <= self.p.cost_margin * 2 * self.model.round_trip_s:",
                   "if gain_s <= 0:")],
    "guess_share0": [(M, "GUESS_SHARE = 0.05\n", "GUESS_SHARE = 0.0\n")],
    "rtrip_guess0": [(C, "resize_guess_s=c.resize_guess_s,", "resize_guess_s=0.0,")],
    "whole_rounds0": [(M, "WHOLE_ROUNDS_MAX = 2\n", "WHOLE_ROUNDS_MAX = 0\n")],
}


def worker(cases: list[str], splits: dict[str, int]) -> None:
    """In the (patched) subprocess: hysteresis on each case from its split; prints JSON."""
    from dynaresize.sim.costs import get_cost_model
    from dynaresize.sim.resolve import resolve_workload
    from dynaresize.sim.run import run_policy

    out = {}
    for name in cases:
        workload, gpus, requests, steps, staleness = CASES[name]
        wl = resolve_workload(workload, seed=0, requests_per_step=requests)
        row = run_policy("hysteresis", wl, gpus, splits[name], steps, staleness, 0,
                         get_cost_model("h100-7b"))
        out[name] = (row["samples_per_s"], row["num_resizes"])
    print(json.dumps(out))


def best_splits(cases: list[str]) -> dict[str, int]:
    from dynaresize.sim.costs import get_cost_model
    from dynaresize.sim.resolve import resolve_workload
    from dynaresize.sim.run import search_split

    out = {}
    for name in cases:
        workload, gpus, requests, steps, staleness = CASES[name]
        wl = resolve_workload(workload, seed=0, requests_per_step=requests)
        out[name] = search_split(wl, gpus, steps, staleness, 0, get_cost_model("h100-7b"))[0]
    return out


def ablate(rule: str, cases: list[str], splits: dict[str, int], tmp: Path) -> dict:
    root = tmp / rule
    shutil.copytree(SRC, root, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for path, old, new in RULES[rule]:
        text = (root / path).read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{rule}: patch of {path} does not apply: {old!r}")
        (root / path).write_text(text.replace(old, new))
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps([cases, splits])],
                          env=env, capture_output=True, text=True, check=True)
    shutil.rmtree(root)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*json.loads(args.worker))
        return 0
    cases, rules = args.cases.split(","), ["none", *(r for r in args.rules.split(",")
                                                     if r != "none")]
    splits = best_splits(cases)
    print(f"| disabled | {' | '.join(cases)} |\n|---|{'---|' * len(cases)}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = {}
        for rule in rules:
            got = ablate(rule, cases, splits, Path(tmp))
            if rule == "none":
                base = got
                cells = [f"{v:.2f} / {k}" for v, k in (got[c] for c in cases)]
            else:
                cells = []
                for c in cases:
                    (v, k), (b, bk) = got[c], base[c]
                    cell = f"{(v / b - 1) * 100:+.1f}%" if abs(v / b - 1) >= 5e-4 else "0"
                    cells.append(cell + (f" ({k})" if k != bk else ""))
            print(f"| {rule} | {' | '.join(cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
