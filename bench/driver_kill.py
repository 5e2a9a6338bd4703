"""Driver death: `kill -9` of the `dynaresize train` driver at random points, then `--resume`
(`dynaresize.app.driver_kill`), against one uninterrupted run of the same config.

    python bench/driver_kill.py [--trials 5] [--steps 6] [--every 2] [--seed 0] [--out DIR]
        [--set KEY=VALUE ...] [--json FILE]

Each trial draws (seeded) after how many finished steps (1 .. steps-1) and how long after
(0-3 s) the driver dies. Prints one row per trial and the totals; exit 1 if any trial lost,
duplicated or changed a record, ended with other parameters, or left an orphan process.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REFERENCE_TIMEOUT_S = 1800.0
"""The uninterrupted reference run's limit (then it is ended, with its cluster)."""

COLS = ["trial", "after_steps", "delay_s", "steps_at_kill", "resumed_from", "recomputed_steps",
        "orphans", "session_empty_s", "resume_rc", "lost", "duplicated", "changed",
        "duplicated_metrics", "params_equal", "survived", "wall_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=2, help="run.checkpoint_every")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    from dynaresize.app.driver_kill import run_bounded, start, train_cmd, trial

    root = Path(args.out or tempfile.mkdtemp(prefix="dynaresize-driver-kill-"))
    root.mkdir(parents=True, exist_ok=True)
    sets = [f"run.steps={args.steps}", f"run.checkpoint_every={args.every}",
            "output.progress='plain'", "output.save_model=false", *args.set]
    reference = root / "reference"
    if not (reference / "summary.json").exists():
        shutil.rmtree(reference, ignore_errors=True)
        if run_bounded(start(train_cmd(sets, reference), root / "reference.log"),
                       REFERENCE_TIMEOUT_S) != 0:
            print(f"the reference run failed: {root / 'reference.log'}", file=sys.stderr)
            return 1
    rng = np.random.default_rng([27, args.seed])
    rows = []
    for i in range(args.trials):
        out = root / f"trial-{i}"
        shutil.rmtree(out, ignore_errors=True)
        row = {"trial": i, **trial(sets, args.steps, out, reference,
                                   int(rng.integers(1, args.steps)), float(rng.uniform(0, 3)))}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print("| " + " | ".join(COLS) + " |\n" + "|---" * len(COLS) + "|")
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in COLS) + " |")
    ok = sum(bool(r["survived"]) for r in rows)
    print(f"\n{len(rows)} driver kills, {ok} resumed with the same records and param_sha256, "
          f"{sum(r.get('orphans', 0) for r in rows)} orphan processes")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
