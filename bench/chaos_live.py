"""Live chaos trials: random device deaths on real Ray devices (SIGKILL of the actor's
process), each run checked against the fault-free run of its variant.

    python bench/chaos_live.py [--trials 20] [--first-seed 0] [--engine builtin|vllm]
        [--mode trap|kill] [--hangs P] [--json FILE] [--out DIR] [--set KEY=VALUE ...]
        [--write]
    python bench/chaos_live.py --engine vllm --from-json a.json b.json --write

The default run (4 CPU devices, 2 rollout / 2 train, the hysteresis policy: streamed training,
pipelined rollouts) shortened to 4 steps of 4 prompts x 4.
- `--mode trap` (default): `app.chaos_live` draws a variant (staleness 0-2, a checkpoint every
  0 or 1 step, a forced resize or none) and 1-2 deaths in any phase (rollout, streamed
  training, optimizer step, weight sync, resize op, checkpoint save; a second one possibly
  inside the first one's recovery), installed as a trap on the run's devices.
- `--mode kill`: `[[faults.kill]]` entries (rollout:F, train, resize; staleness 0/1), which
  turn pipelined rollouts off.
- `--hangs P` (trap mode): each death is a freeze (SIGSTOP) with probability P, found by the
  hang watchdog after `faults.hang_timeout_s` (`HANG_TIMEOUT_S` here); its block is
  `chaos-live-ENGINE-trap-hangs` (P = 1) or `chaos-live-ENGINE-trap-hangs-P`.
Reported per trial: finished, lost / duplicated / wrong-version / changed samples against the
reference, whether `param_sha256` equals the reference's (exact reduction: bitwise) and the
largest parameter difference, recovery seconds and replayed steps. One Ray cluster and one
device pool for all (repaired after each run), as `bench/faults.py`.

`--write` puts the table into docs/results.md (between `<!-- chaos-live-ENGINE-MODE:start -->`
and `<!-- chaos-live-ENGINE-MODE:end -->`); `--from-json` renders trials of earlier runs (for
example a campaign split into several processes) without running any.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import audit, param_diff  # noqa: E402
from policies import block_markers, write_block  # noqa: E402  (bench/ is not a package)

from dynaresize.app.chaos_live import RESIZE  # noqa: E402

BASE = ["run.steps=4", "task.prompts_per_step=4", "task.samples_per_prompt=4",
        "task.max_new_tokens=12", "train.micro_batch_size=2", "output.progress='plain'",
        "rollout.slice_s=0.05", "rollout.max_running_requests=4", "output.save_model=true"]


HANG_TIMEOUT_S = 3.0
"""The trials' `faults.hang_timeout_s` with `--hangs`: a frozen device is killed this soon."""


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


COLUMNS = ("seed", "variant", "kills", "finished", "lost", "duplicated", "wrong_version",
           "tokens_changed", "params_equal", "recovery_s", "replayed_steps", "run_s")
TOTALS = ("survived", "deaths", "lost", "duplicated", "wrong_version", "tokens_changed",
          "params_equal", "num_faults", "replayed_steps")


def cell(row: dict[str, Any], key: str) -> str:
    if key == "variant":
        return ", ".join(v.replace(RESIZE, "resize at step 1")
                         for v in row["variant"]).replace("run.", "")
    if key == "kills" and isinstance(row["kills"], str):
        return row["kills"]
    if key == "kills":
        return "; ".join(f"dev {k['device']} step {k['step']} {k['at']}" for k in row["kills"])
    return str(row[key])


def totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {k: sum(r[k] for r in rows) for k in TOTALS}


def render(rows: list[dict[str, Any]], engine: str, mode: str, hangs: float = 0.0) -> str:
    """The campaign's markdown: a summary line and a line per trial."""
    total = totals(rows)
    how = ("deaths in every phase, trapped on the run's devices (streamed, pipelined)"
           if mode == "trap" else "random `[[faults.kill]]` (unpipelined)")
    flag = f" --hangs {hangs:g}" if hangs else ""
    if hangs:
        how += (f"; each death a freeze (SIGSTOP) with probability {hangs:g}, killed by the "
                f"hang watchdog after {HANG_TIMEOUT_S:g} s (the kills column says 'frozen')")
    head = (f"**Live random deaths, {engine} engine, {mode} mode** (`python bench/chaos_live.py "
            f"--engine {engine} --mode {mode}{flag} --trials {len(rows)} --write`: the default "
            f"run, 4 "
            f"CPU devices 2 rollout / 2 train, hysteresis, 4 steps of 4 prompts x 4; {how}; "
            f"each run against the fault-free run of its variant; measured "
            f"{time.strftime('%Y-%m-%d')}): **{len(rows)} trials, {total['survived']} "
            f"survived**, {total['deaths']} deaths ({total['num_faults']} recoveries); lost "
            f"{total['lost']}, duplicated "
            f"{total['duplicated']}, wrong version {total['wrong_version']}, changed "
            f"{total['tokens_changed']}; parameters equal to the fault-free run's (sha256) in "
            f"{total['params_equal']}; {total['replayed_steps']} steps replayed.")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r, k) for k in COLUMNS) + " |" for r in rows]
    failed = [r for r in rows if not r["survived"]]
    notes = [f"Seed {r['seed']} did not survive: "
             f"{r['error'].strip().splitlines()[-1][:200] if r['error'] else 'records differ'}"
             for r in failed]
    return "\n".join([head, "", *lines, *([""] + notes if notes else [])])




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--engine", default="builtin", choices=("builtin", "vllm"))
    parser.add_argument("--json")
    parser.add_argument("--out")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--mode", default="trap", choices=("trap", "kill"),
                        help="trap: deaths in every phase, the run's own code path "
                             "(app.chaos_live); kill: `[[faults.kill]]` entries")
    parser.add_argument("--hangs", type=float, default=0.0, metavar="P",
                        help="trap mode: the probability that a death is a freeze (SIGSTOP, "
                             "found by the hang watchdog) rather than a SIGKILL")
    parser.add_argument("--write", action="store_true",
                        help="write the table into docs/results.md")
    parser.add_argument("--from-json", nargs="+", metavar="FILE",
                        help="render the trials of these --json files instead of running")
    args = parser.parse_args(argv)
    if not 0.0 <= args.hangs <= 1.0 or (args.hangs and args.mode != "trap"):
        parser.error(f"--hangs {args.hangs}: a probability in [0, 1], with --mode trap")
    rows = [r for f in args.from_json for r in json.loads(Path(f).read_text())] \
        if args.from_json else campaign(args)
    text = render(rows, args.engine, args.mode, args.hangs)
    if args.from_json:
        print(text)
    if args.write:
        hangs = "" if not args.hangs else "-hangs" if args.hangs == 1 else f"-hangs-{args.hangs:g}"
        write_block(*block_markers(f"chaos-live-{args.engine}-{args.mode}{hangs}"), text)
    total = totals(rows)
    print(f"{args.engine}: {len(rows)} trials, {json.dumps(total)}")
    return 0 if total["survived"] == len(rows) else 1


def reference(run: Any, root: Path, base: list[str], variant: list[str]
              ) -> tuple[Path, dict[Any, Any], str, dict[str, int]]:
    """The fault-free run of `variant` (kept in `root` across invocations): its directory,
    sample view, `param_sha256` and call count per phase (`LiveTrap` without deaths)."""
    from dynaresize.app.chaos_live import LiveTrap
    from dynaresize.core.rundir import read_jsonl

    key = " ".join(variant)
    ref = root / f"reference-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    tag, counts = ref / "variant.txt", ref / "calls.json"
    if (ref / "summary.json").exists() and tag.exists() and tag.read_text() == key \
            and counts.exists():
        summary = json.loads((ref / "summary.json").read_text())
        calls = json.loads(counts.read_text())
    else:
        trap = LiveTrap(())
        summary = run([*base, *variant], ref, trap.install)
        calls = dict(trap.calls)
        tag.write_text(key)
        counts.write_text(json.dumps(calls))
    view = {(s["step"], s["prompt"], s["sample"]): (s["version"], s["tokens_sha256"])
            for s in read_jsonl(ref / "samples.jsonl")}
    return ref, view, summary["param_sha256"], calls


def trial(run: Any, seed: int, root: Path, base: list[str], refs: dict[str, Any],
          mode: str, hang_p: float = 0.0) -> dict[str, Any]:
    """One trial (module doc): its row."""
    from dynaresize.app.chaos_live import LiveTrap, describe, draw_live
    from dynaresize.config import load_config

    def ref_of(variant: list[str]) -> Any:
        key = " ".join(variant)
        if key not in refs:
            refs[key] = reference(run, root, base, variant)
        return refs[key]

    trap, extra = None, []
    if mode == "trap":
        variant, deaths = draw_live(seed, lambda v: ref_of(v)[3])
        trap = LiveTrap(deaths, seed, hang_p)
    else:
        variant, kills = draw(seed)
        extra = [kill_toml(kills)]
    ref, view, sha, _ = ref_of(variant)
    out = root / f"trial-{seed}"
    (out / "error.txt").unlink(missing_ok=True)  # of an earlier run of this trial
    t0 = time.monotonic()
    try:
        summary, error = run([*base, *variant, *extra], out,
                             trap.install if trap else None), ""
    except Exception as exc:  # a fault the run did not survive: the table says so
        full = f"{type(exc).__name__}: {exc}"
        (out / "error.txt").write_text(traceback.format_exc())  # the row keeps its end
        summary, error = {}, full if len(full) <= 400 else "..." + full[-400:]
    faults = summary.get("faults", [])
    cfg = load_config(None, [*base, *variant], check_machine=False)
    row = {"seed": seed, "variant": variant,
           "kills": describe(trap.deaths, trap.fired, tuple(trap.hung)) if trap else kills,
           "finished": not error,
           **audit(out, view, cfg), "params_equal": summary.get("param_sha256") == sha,
           "max_param_diff": param_diff(out, ref) if not error else float("nan"),
           "deaths": sum(k is not None and k >= 0 for k in trap.fired) if trap else len(kills),
           "num_faults": len(faults),
           "recovery_s": round(sum(f.get("recovery_s", 0.0) for f in faults), 2),
           "replayed_steps": sum(f.get("replayed_steps", 0) for f in faults),
           "run_s": round(time.monotonic() - t0, 1), "error": error}
    row["survived"] = row["finished"] and not (row["lost"] or row["duplicated"] or
                                               row["wrong_version"] or row["tokens_changed"]
                                               or not row["params_equal"])
    return row


def campaign(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the trials (module doc); one row per trial."""
    from dynaresize.devices.ray_device import ray_session

    root = Path(args.out or tempfile.mkdtemp(prefix="dynaresize-chaos-live-"))
    base = [*BASE, f"rollout.engine='{args.engine}'", *args.set]
    if args.hangs:
        base.append(f"faults.hang_timeout_s={HANG_TIMEOUT_S}")
    with ray_session(num_cpus=4):  # ends a cluster it started, on an error or Ctrl-C too
        return _trials(args, root, base)


def _trials(args: argparse.Namespace, root: Path, base: list[str]) -> list[dict[str, Any]]:
    """`campaign`'s trials, on pools of 4 devices of the Ray cluster it started."""
    from dynaresize.app.runner import run_training
    from dynaresize.config import load_config
    from dynaresize.devices.pool import DevicePool

    pools = [DevicePool(4)]

    def run(overrides: list[str], out: Path, chaos: Any) -> dict[str, Any]:
        cfg = load_config(None, overrides, check_machine=False)
        try:
            return run_training(cfg, out, pool=pools[-1], chaos=chaos)
        except Exception:  # a failed run may leave the shared pool broken (its repair
            pools[-1].shutdown()  # failed too): the next trials get a fresh one
            pools.append(DevicePool(4))
            raise

    refs: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    try:
        for seed in range(args.first_seed, args.first_seed + args.trials):
            rows.append(trial(run, seed, root, base, refs, args.mode, args.hangs))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    finally:
        pools[-1].shutdown()
    return rows


if __name__ == "__main__":
    sys.exit(main())
