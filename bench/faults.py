"""The fault table: kill a device for real in each way `[[faults.kill]]` offers, and count.

    python bench/faults.py [--json] [--out DIR]

Runs, on one local Ray cluster (loopback) and one 4-device CPU pool (2 rollout / 2 train):
a reference run without faults, then one run per fault (a rollout device mid-rollout, a
training device mid-step, with and without a checkpoint to recover from, and a device during
a resize). For each it prints whether the run finished, how many expected samples are missing,
duplicated or carry the wrong version, whether the tokens equal the reference's, and the
largest parameter difference to the reference. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BASE = ["run.steps=3", "run.staleness=1", "task.prompts_per_step=4",
        "task.samples_per_prompt=4", "task.max_new_tokens=12", "train.micro_batch_size=2",
        "output.progress='plain'", "rollout.slice_s=0.05", "rollout.max_running_requests=4"]
FAULTS = [
    ("rollout device, mid-rollout", ["faults.kill=[{device=1, step=1, at='rollout:0.3'}]"]),
    ("train device, mid-step", ["faults.kill=[{device=3, step=2, at='train'}]"]),
    ("train device, mid-step, checkpoint", ["run.checkpoint_every=1",
                                            "faults.kill=[{device=3, step=2, at='train'}]"]),
    ("device mid-resize", ["resize.schedule=[{step=1, at='start', move='rollout->train', "
                           "num_devices=1}]", "faults.kill=[{device=1, step=1, at='resize'}]"]),
]


def audit(out: Path, reference: dict[tuple[int, int, int], tuple[int, str]], cfg: Any
          ) -> dict[str, int]:
    """Missing, duplicated, wrong-version and changed samples against the expected set."""
    from dynaresize.core.rundir import read_jsonl

    records = read_jsonl(out / "samples.jsonl") if (out / "samples.jsonl").exists() else []
    keys = [(s["step"], s["prompt"], s["sample"]) for s in records]
    got = {(s["step"], s["prompt"], s["sample"]): (s["version"], s["tokens_sha256"])
           for s in records}
    return {"lost": len(set(reference) - set(got)),
            "duplicated": len(keys) - len(set(keys)),
            "wrong_version": sum(v != max(0, k[0] - cfg.run.staleness)
                                 for k, (v, _) in got.items()),
            "tokens_changed": sum(got[k] != reference[k] for k in set(got) & set(reference))}


def param_diff(a: Path, b: Path) -> float:
    import torch

    if not (a / "model.pt").exists():
        return float("nan")
    sa, sb = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    return max(float((sa[k].double() - sb[k].double()).abs().max()) for k in sa)


def run_faults(pool: Any, root: Path) -> list[dict[str, Any]]:
    """The reference run, then one run per entry of FAULTS on `pool`; one row per fault."""
    from dynaresize.app.runner import run_training
    from dynaresize.config import load_config
    from dynaresize.core.rundir import read_jsonl

    rows = []
    cfg = load_config(None, BASE, check_machine=False)
    run_training(cfg, root / "reference", pool=pool)
    reference = {(s["step"], s["prompt"], s["sample"]): (s["version"], s["tokens_sha256"])
                 for s in read_jsonl(root / "reference" / "samples.jsonl")}
    for name, overrides in FAULTS:
        cfg = load_config(None, [*BASE, *overrides], check_machine=False)
        out = root / name.replace(" ", "_").replace(",", "")
        t0 = time.monotonic()
        try:
            summary, error = run_training(cfg, out, pool=pool), ""
        except Exception as exc:  # a fault the run did not survive: the table says so
            summary, error = {}, f"{type(exc).__name__}: {exc}"[:120]
        faults = summary.get("faults", [{}])
        rows.append({"fault": name, "tried": 1, "survived": int(not error),
                     **audit(out, reference, cfg),
                     "max_param_diff": param_diff(out, root / "reference"),
                     "recovery_s": round(sum(f.get("recovery_s", 0.0) for f in faults), 2),
                     "replayed_steps": sum(f.get("replayed_steps", 0) for f in faults),
                     "rerun_requests": sum(f.get("rerun_requests", 0) for f in faults),
                     "run_s": round(time.monotonic() - t0, 1), "error": error})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    parser.add_argument("--out", help="keep the run directories here")
    args = parser.parse_args(argv)

    from dynaresize.devices.pool import DevicePool
    from dynaresize.devices.ray_device import ray_session

    root = Path(args.out or tempfile.mkdtemp(prefix="dynaresize-faults-"))
    with ray_session(num_cpus=4):  # ends a cluster it started, on an error or Ctrl-C too
        pool = DevicePool(4)
        try:
            rows = run_faults(pool, root)
        finally:
            pool.shutdown()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    cols = ["fault", "tried", "survived", "lost", "duplicated", "wrong_version",
            "tokens_changed", "max_param_diff", "recovery_s", "replayed_steps",
            "rerun_requests", "run_s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = [f"{r[c]:.1e}" if c == "max_param_diff" else str(r[c]) for c in cols]
        print("| " + " | ".join(cells) + " |")
    total = {c: sum(r[c] for r in rows) for c in ("tried", "survived", "lost", "duplicated")}
    print(f"\n{total['tried']} faults tried, {total['survived']} survived, "
          f"{total['lost']} samples lost, {total['duplicated']} duplicated")
    return 0 if total["survived"] == total["tried"] and not total["lost"] else 1


if __name__ == "__main__":
    sys.exit(main())
