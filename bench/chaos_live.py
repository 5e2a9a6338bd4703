"""Live chaos trials: random `[[faults.kill]]` on real Ray devices (SIGKILL of the actor's
process), each run checked against the fault-free run of its variant.

    python bench/chaos_live.py [--trials 20] [--first-seed 0] [--engine builtin|vllm]
        [--json FILE] [--set KEY=VALUE ...]

The default run (4 CPU devices, 2 rollout / 2 train, the hysteresis policy) shortened to 4
steps. Each trial draws (seeded): staleness 0/1, checkpoint every 0/1 step, a forced resize or
none, and 1-2 kills (at most one per starting pool): the device, the step, and where
(`rollout:F` with F random, `train`, or `resize` when the trial has one). Reported per trial:
finished, lost / duplicated / wrong-version / changed samples against the reference, whether
`param_sha256` equals the reference's (exact reduction: bitwise) and the largest parameter
difference, recovery seconds and replayed steps. One Ray cluster and one device pool for all
(repaired after each run), as `bench/faults.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import audit, param_diff  # noqa: E402

BASE = ["run.steps=4", "task.prompts_per_step=4", "task.samples_per_prompt=4",
        "task.max_new_tokens=12", "train.micro_batch_size=2", "output.progress='plain'",
        "rollout.slice_s=0.05", "rollout.max_running_requests=4", "output.save_model=true"]
RESIZE = "resize.schedule=[{step=1, at='start', move='rollout->train', num_devices=1}]"


def draw(seed: int) -> tuple[list[str], list[dict[str, Any]]]:
    """(variant overrides, kill entries) of trial `seed`."""
    rng = np.random.default_rng([2027, seed])
    variant = [f"run.staleness={int(rng.integers(0, 2))}",
               f"run.checkpoint_every={int(rng.integers(0, 2))}"]
    resize = rng.random() < 0.3
    if resize:
        variant.append(RESIZE)
    kills = []
    pools = [[1] if resize else [0, 1], [2, 3]]  # the resize leaves device 0 alone in
    for pool in rng.permutation(2)[:int(rng.integers(1, 3))]:  # the rollout pool: spare it
        at = str(rng.choice(["rollout", "train", "resize"] if resize else ["rollout", "train"]))
        step = 1 if at == "resize" else int(rng.integers(0, 4))
        if at == "rollout":
            at = f"rollout:{rng.uniform(0, 0.9):.2f}"
        kills.append({"device": int(rng.choice(pools[pool])), "step": step, "at": at})
    return variant, kills


def kill_toml(kills: list[dict[str, Any]]) -> str:
    return "faults.kill=[" + ", ".join(
        f"{{device={k['device']}, step={k['step']}, at='{k['at']}'}}" for k in kills) + "]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--engine", default="builtin")
    parser.add_argument("--json")
    parser.add_argument("--out")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args(argv)

    from dynaresize.app.runner import run_training
    from dynaresize.config import load_config
    from dynaresize.core.rundir import read_jsonl
    from dynaresize.devices.ray_device import DevicePool, ensure_ray

    root = Path(args.out or tempfile.mkdtemp(prefix="dynaresize-chaos-live-"))
    base = [*BASE, f"rollout.engine='{args.engine}'", *args.set]
    started = ensure_ray(num_cpus=4)
    pool = DevicePool(4)
    refs: dict[str, tuple[Path, dict[Any, Any], str]] = {}
    rows = []
    try:
        for seed in range(args.first_seed, args.first_seed + args.trials):
            variant, kills = draw(seed)
            key = " ".join(v for v in variant if "checkpoint" not in v)
            if key not in refs:
                ref = root / f"reference-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
                cfg = load_config(None, [*base, *variant], check_machine=False)
                tag = ref / "variant.txt"
                if (ref / "summary.json").exists() and tag.exists() and tag.read_text() == key:
                    summary = json.loads((ref / "summary.json").read_text())  # kept from --out
                else:
                    summary = run_training(cfg, ref, pool=pool)
                    tag.write_text(key)
                view = {(s["step"], s["prompt"], s["sample"]): (s["version"], s["tokens_sha256"])
                        for s in read_jsonl(ref / "samples.jsonl")}
                refs[key] = (ref, view, summary["param_sha256"])
            ref, view, sha = refs[key]
            cfg = load_config(None, [*base, *variant, kill_toml(kills)], check_machine=False)
            out = root / f"trial-{seed}"
            t0 = time.monotonic()
            try:
                summary, error = run_training(cfg, out, pool=pool), ""
            except Exception as exc:  # a fault the run did not survive: the table says so
                summary, error = {}, f"{type(exc).__name__}: {exc}"[:300]
            faults = summary.get("faults", [])
            row = {"seed": seed, "variant": variant, "kills": kills, "finished": not error,
                   **audit(out, view, cfg), "params_equal": summary.get("param_sha256") == sha,
                   "max_param_diff": param_diff(out, ref) if not error else float("nan"),
                   "num_faults": len(faults),
                   "recovery_s": round(sum(f.get("recovery_s", 0.0) for f in faults), 2),
                   "replayed_steps": sum(f.get("replayed_steps", 0) for f in faults),
                   "run_s": round(time.monotonic() - t0, 1), "error": error}
            row["survived"] = row["finished"] and not (row["lost"] or row["duplicated"] or
                                                       row["wrong_version"] or
                                                       row["tokens_changed"])
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    finally:
        pool.shutdown()
        if started:
            import ray

            ray.shutdown()
    total = {k: sum(r[k] for r in rows) for k in ("survived", "lost", "duplicated",
                                                   "wrong_version", "tokens_changed",
                                                   "params_equal", "num_faults",
                                                   "replayed_steps")}
    print(f"{args.engine}: {len(rows)} trials, {json.dumps(total)}")
    return 0 if total["survived"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
