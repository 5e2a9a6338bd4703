"""`dynaresize simulate` and `dynaresize calibrate` (registered through `register`).

Arguments are checked before anything heavy runs; bad input raises `UsageError` /
`ConfigError`, which `dynaresize.cli.main` turns into exit code 2 with the message.

Faults and speculation from a config file or `--set`: `sim.cli_config`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dynaresize.cli import UsageError, check_out_dir, check_out_file
from dynaresize.sim.cli_config import check_run_dir, twin_faults, twin_speculation

TABLE_COLUMNS = (("policy", "policy", "{}"), ("split", "split R/T", "{}"),
                 ("mean_step_s", "mean step s", "{:.2f}"), ("p99_step_s", "p99 step s", "{:.2f}"),
                 ("samples_per_s", "samples/s", "{:.2f}"), ("tokens_per_s", "tokens/s", "{:.0f}"),
                 ("bubble_fraction", "bubble", "{:.1%}"),
                 ("idle_device_s_per_step", "idle dev-s/step", "{:.0f}"),
                 ("num_resizes", "resizes", "{}"))


def _split_text(split: Any) -> str:
    if not split:
        return "-"
    return f"{split['rollout']}/{split['train']}"


def format_table(out: dict[str, Any]) -> str:
    """The text mode of `simulate`: a header and one line per policy."""
    rows = []
    for r in out["results"]:
        cells = []
        for key, _, fmt in TABLE_COLUMNS:
            value = r.get(key)
            cells.append(_split_text(value) if key == "split" else
                         "-" if value is None else fmt.format(value))
        rows.append(cells)
    head = [title for _, title, _ in TABLE_COLUMNS]
    widths = [max(len(h), *(len(c[i]) for c in rows)) for i, h in enumerate(head)]
    lines = [f"workload {out['workload']}, {out['gpus']} GPUs ({out.get('cost_model', '')}), "
             f"{out['steps']} steps, staleness {out.get('staleness', '')}",
             "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(cells, widths))) for cells in rows]
    for r in out["results"]:
        if "num_faults" in r:
            lines.append(f"{r['policy']}: {r['num_faults']} device death(s), recovery "
                         f"{r['recovery_s']:.1f} s, {r['replayed_steps']} step(s) replayed"
                         + (f", {r['kills_not_fired']} kill(s) never fired (no such moment)"
                            if r.get("kills_not_fired") else ""))
    oracle = next((r for r in out["results"] if r["policy"] == "oracle"), None)
    if oracle:
        lines.append(f"oracle: {oracle['tail_bound_steps']} tail-bound, "
                     f"{oracle['work_bound_steps']} work-bound steps")
    if out.get("speculation"):
        spec = out["speculation"]
        lines.append(f"speculation {spec['name']} (mean {spec['mean_accepted']:.2f} accepted "
                     "tokens per verify iteration at the deepest budget): " + ", ".join(
                         f"{r['policy']} {r['accepted_per_iteration']}/iter on "
                         f"{r['speculating_share']:.0%} of request-iterations"
                         for r in out["results"] if r.get("accepted_per_iteration")))
    if out.get("hysteresis_vs"):
        lines.append("hysteresis samples/s as a fraction of: " + ", ".join(
            f"{p} {x:.2f}x" for p, x in out["hysteresis_vs"].items()))
    churn = out.get("churn")
    if churn:
        saved = churn["saved_s_per_step"]
        lines.append(f"hysteresis churn: {churn['resizes_per_step']:.2f} resizes/step, "
                     f"{churn['resize_s_per_step']:.2f} s/step on resizes' critical paths"
                     + (f", saves {saved:.2f} s/step vs {churn['versus']}"
                        if saved is not None else ""))
    return "\n".join(lines)


def _policies(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(p.strip() for p in text.split(","))
    if not any(names):
        raise UsageError(f"--policy {text!r}: give a comma-separated list of policies")
    if "" in names:
        raise UsageError(f"--policy {text!r}: an empty policy name (give names separated by "
                         "single commas, e.g. static,hysteresis)")
    twice = next((p for i, p in enumerate(names) if p in names[:i]), None)
    if twice is not None:
        raise UsageError(f"--policy {text!r}: {twice!r} is given twice (each policy once)")
    return names


def cmd_simulate(args: argparse.Namespace) -> int:
    """Consumes the parsed arguments; prints the table or the JSON object; writes --out."""
    from dynaresize.sim.calibrate import load_calibration, load_run_config, trace_from_run
    from dynaresize.sim.cli_episodes import default_policies, episode_workload_from_args
    from dynaresize.sim.resolve import resolve_workload
    from dynaresize.sim.run import simulate

    args.gpus_given, args.staleness_given = args.gpus, args.staleness
    args.gpus = 64 if args.gpus is None else args.gpus
    args.staleness = 1 if args.staleness is None else args.staleness
    if args.gpus < 2:
        raise UsageError(f"--gpus {args.gpus}: must be >= 2 (one device per stage)")
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps {args.steps}: must be >= 1")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers {args.workers}: must be >= 1")
    if args.requests_per_step is not None and args.requests_per_step < 1:
        raise UsageError(f"--requests-per-step {args.requests_per_step}: must be >= 1")
    if args.seed < 0:
        raise UsageError(f"--seed {args.seed}: must be >= 0")
    if args.out is not None:
        check_out_dir("--out", args.out)
    try:
        costs: Any = args.cost_model
        if args.calibration:
            costs = load_calibration(args.calibration)
        gpus, split, staleness = args.gpus, args.split, args.staleness
        if args.from_run:
            check_run_dir(args.from_run, "--from-run")
            workload: Any = trace_from_run(args.from_run)
            run_cfg = load_run_config(args.from_run)
            gpus = args.gpus_given or run_cfg.num_devices
            split = split or run_cfg.allocation.num_rollout_devices
            staleness = run_cfg.run.staleness if args.staleness_given is None else staleness
        else:
            workload = episode_workload_from_args(args) or resolve_workload(
                args.workload or "dapo-7b", seed=args.seed,
                requests_per_step=args.requests_per_step)
        steps = args.steps or (workload.num_steps if workload.num_steps else 50)
        faults = twin_faults(args.config, args.set or [], gpus, steps)
        speculation = twin_speculation(args.speculation, args.config, args.set or [])
        run_policy = None
        if args.from_run:  # the policy the live run ran (a forced schedule runs as static)
            run_policy = "static" if run_cfg.resize.schedule else run_cfg.controller.policy
        oracle = () if faults else ("oracle",)  # the oracle has no devices to kill
        policies = _policies(args.policy) or ((run_policy, *oracle) if run_policy else
                                              default_policies(workload))
        out = simulate(workload, gpus, policies, steps=steps, staleness=staleness,
                       seed=args.seed, cost_model=costs, out_dir=args.out, split=split,
                       faults=faults, speculation=speculation, workers=args.workers)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "simulate.json").write_text(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out))
    else:
        print(format_table(out))
        if args.out:
            print(f"run directories: {args.out}/<policy>/ (see `dynaresize report DIR`)")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Fit cost-model parameters from a live run directory; print them; write JSON."""
    from dynaresize.sim.calibrate import calibrate, write_calibration
    from dynaresize.sim.cli_episodes import cmd_calibrate_episodes

    if args.episodes:
        return cmd_calibrate_episodes(args)
    if not args.run_dir:
        raise UsageError("calibrate: give RUN_DIR (a `dynaresize train --out` directory) or "
                         "--episodes SUMMARY.json")
    check_run_dir(args.run_dir, "calibrate")
    path = Path(args.out) if args.out else Path(args.run_dir) / "calibration.json"
    check_out_file("--out", str(path))
    try:
        fit = calibrate(args.run_dir)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    write_calibration(fit, path)
    for key, value in fit["fitted"].items():
        print(f"{key:28s} {value:.6g}")
    print(f"fit residual (rollout spans): {fit['quality']['rollout_rel_rmse']:.1%}; "
          f"written: {path}", file=sys.stderr)
    return 0


def _policy_help() -> str:
    """`--policy`'s help, from the twin's and the controller registry's policy names."""
    from dynaresize.sim.run import default_policies, load_policies

    return (f"comma-separated, from: {', '.join(load_policies())} (default: "
            f"{', '.join(default_policies())}; with --from-run: the run's policy and oracle)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `simulate` and `calibrate` to the `dynaresize` command."""
    from dynaresize.sim.cli_episodes import add_calibrate_flags, add_simulate_flags

    sim = subparsers.add_parser("simulate", help="compare allocation policies on a workload "
                                "in the digital twin (virtual time, SimDevices)")
    sim.add_argument("--workload", metavar="NAME|FILE", help="preset (dapo-7b (default), "
                     "balanced, agentic, drift, agentic-turns) or a .jsonl trace")
    sim.add_argument("--from-run", metavar="DIR",
                     help="replay a live run's samples.jsonl (prompt lengths rebuilt from its "
                     "config.toml) instead of --workload")
    sim.add_argument("--gpus", type=int, help="number of devices (>= 2; default 64, or the "
                     "--from-run config's)")
    sim.add_argument("--split", type=int, metavar="R", help="fix static's rollout devices "
                     "(default: searched; with --from-run: the run's)")
    sim.add_argument("--policy", metavar="P,...", help=_policy_help())
    sim.add_argument("--steps", type=int, help="RL steps (default 50, or the trace's)")
    sim.add_argument("--staleness", type=int,
                     help="k: step t samples from version t-k (0 on-policy, 1 one-step-off, up "
                          "to 8; default 1)")
    sim.add_argument("--seed", type=int, default=0, help="workload seed")
    sim.add_argument("--requests-per-step", type=int, help="rescale a preset's batch")
    sim.add_argument("--cost-model", default="h100-7b",
                     help="h100-7b, h200-7b, h100-32b, h200-32b")
    sim.add_argument("--calibration", metavar="FILE", help="calibration.json from "
                     "`dynaresize calibrate` (replaces --cost-model)")
    sim.add_argument("--config", metavar="FILE.toml", help="take [[faults.kill]] device deaths "
                     "and run.checkpoint_every from this config (as `dynaresize train` does; "
                     "other sections ignored); with faults, the orchestrator's policies run")
    sim.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="set faults.kill, faults.timeout_s, faults.hang_timeout_s or "
                     "run.checkpoint_every, e.g. "
                     "--set \"faults.kill=[{device=900, step=1, at='train'}]\" (repeatable)")
    sim.add_argument("--speculation", metavar="off|das|FILE.json", help="speculative "
                     "decoding for every policy alike: off (default), das (DAS-sized preset) "
                     "or an accepted-tokens histogram {\"accepted_per_iteration\": {...}}; "
                     "also [sim] speculation in --config, --set sim.speculation=...")
    sim.add_argument("--workers", type=int, metavar="N", help="processes for the split "
                     "search's probes and the policies' runs (default: the usable cores, for "
                     "runs of 16384 request-steps or more); the numbers do not depend on it")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument("--out", metavar="DIR", help="write a run directory per policy")
    add_simulate_flags(sim)
    sim.set_defaults(func=cmd_simulate)

    cal = subparsers.add_parser("calibrate", help="fit the twin's cost model to a live run")
    cal.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                     help="a `dynaresize train --out` directory")
    cal.add_argument("--out", metavar="FILE", help="default: RUN_DIR/calibration.json "
                     "(--episodes: SUMMARY.episode_model.json)")
    add_calibrate_flags(cal)
    cal.set_defaults(func=cmd_calibrate)
