"""`dynaresize bench resize`: resize latency, our executor against a naive restart.

Arguments are parsed before torch or Ray is imported; the work is in
`dynaresize.app.benchmarks.resize_latency`. Progress goes to stderr, the table (or `--json`) to
stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def _share(kind: str, share: float, row: dict[str, Any]) -> str:
    if kind == "reshard":  # split: building the new trainers / moving the state
        transfer = row["reshard_transfer_share"]
        return f"reshard {_pct(share)} (transfer {_pct(transfer)})"
    return f"{kind} {_pct(share)}"


def format_table(result: dict[str, Any]) -> str:
    """The markdown table of README / docs/resize-benchmark.md."""
    lines = ["| model | move | ours, first (s) | ours, repeat (s) | naive (s) | "
             "naive / ours | training group ready: ours / naive (s) | group creations "
             "first → repeat | share of our critical path (repeat) | bytes moved | "
             "peak staging |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in result["models"]:
        label = f"{model['name']} ({model['num_params'] / 1e6:.1f}M)"
        for row in model["summary"]:
            shares = ", ".join(_share(k, v, row) for k, v in sorted(
                row["path_shares"].items(), key=lambda kv: -kv[1]) if v >= 0.005)
            naive = f"{row['naive_s']:.2f}" if "naive_s" in row else "–"
            ratio = f"**{row['ratio']:.1f}×**" if "ratio" in row else "–"
            group = (f"{row['ours_group_ready_s']:.3f} / {row['naive_group_ready_s']:.2f} "
                     f"({row['group_ratio']:.1f}×)" if "group_ratio" in row else "–")
            lines.append(
                f"| {label} | {row['move']} | {row['ours_first_s']:.3f} | "
                f"{row['ours_repeat_s']:.3f} | {naive} | {ratio} | {group} | "
                f"{row['group_creations_first']} → {row['group_creations_repeat']} | {shares} | "
                f"{row['bytes_moved'] / 2**20:.1f} MiB | "
                f"{row['peak_staging_bytes'] / 2**20:.2f} MiB "
                f"(bound {row['staging_bytes'] / 2**20:.2f}) |")
    return "\n".join(lines)


def format_naive(result: dict[str, Any]) -> str:
    """Phases of each naive resize, and the checkpoint write (not on its critical path)."""
    lines = []
    for model in result["models"]:
        ckpt = model.get("checkpoint")
        if ckpt:
            lines.append(f"{model['name']}: DCP checkpoint write {ckpt['save_s']:.2f}s, "
                         f"{ckpt['checkpoint_bytes'] / 2**20:.0f} MiB (off the naive path)")
        for move, m in model.get("naive", {}).items():
            phases = ", ".join(f"{k} {v:.2f}s" for k, v in m["phases_s"].items() if v)
            lines.append(f"{model['name']} naive {move}: {m['critical_path_s']:.2f}s; phases "
                         f"(overlapping, slowest member): {phases}")
    return "\n".join(lines)


def cmd_bench_resize(args: argparse.Namespace) -> int:
    from dynaresize.app.benchmarks.resize_latency import MODELS, NAIVE_MOVES, run_resize_bench

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    from dynaresize.cli import UsageError, check_out_file

    if not models or any(m not in MODELS for m in models):
        raise UsageError(f"--models {args.models!r}: allowed {', '.join(MODELS)}")
    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats}: must be >= 1")
    if args.out is not None:  # before the benchmark, not after it
        check_out_file("--out", args.out)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = run_resize_bench(models, repeats=args.repeats, staging_bytes=args.staging_bytes,
                              naive_moves=() if args.no_naive else NAIVE_MOVES,
                              progress=progress,
                              extra=tuple(args.set or ()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_table(result))
        print()
        print(format_naive(result))
    return 0


def cmd_bench_rollout(args: argparse.Namespace) -> int:
    from dynaresize.cli import UsageError, check_out_file

    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens}: must be >= 1")
    if args.write_results is not None:
        check_out_file("--write-results", args.write_results, make_parents=True)
    from dynaresize.config import load_config

    # exit 2 before any work if vLLM is missing or cannot serve the model
    load_config(None, ["model.num_heads=2", "rollout.engine='vllm'", *(args.set or ())])
    from dynaresize.app.benchmarks.rollout_engines import (
        format_results,
        run_rollout_bench,
        write_results,
    )

    result = run_rollout_bench(args.max_new_tokens, tuple(args.set or ()),
                               progress=lambda line: print(line, file=sys.stderr, flush=True))
    text = format_results(result)
    if args.write_results:
        write_results(text, args.write_results)
    print(json.dumps(result, indent=1) if args.json else text)
    return 0


def cmd_bench_chaos(args: argparse.Namespace) -> int:
    import time

    from dynaresize.cli import UsageError

    if args.trials < 1:
        raise UsageError(f"--trials {args.trials}: must be >= 1")
    if args.first_seed < 0:
        raise UsageError(f"--first-seed {args.first_seed}: must be >= 0")
    if not 0.0 <= args.hangs <= 1.0:
        raise UsageError(f"--hangs {args.hangs}: must be in 0..1 (a death's chance of being "
                         "a freeze)")
    from dynaresize.sim.chaos_campaign import Campaign, markdown

    campaign, rows, cpu0 = Campaign(args.hangs), [], time.process_time()
    for seed in range(args.first_seed, args.first_seed + args.trials):
        rows.append(campaign.trial(seed))
        if not rows[-1]["survived"]:
            print(f"trial {seed} failed: {rows[-1].get('error', rows[-1])}", file=sys.stderr)
    print(markdown(rows, time.process_time() - cpu0, args.hangs))
    return 0 if all(r["survived"] for r in rows) else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench resize`, `bench rollout` and `bench chaos` to the `dynaresize` command."""
    bench = subparsers.add_parser("bench", help="benchmarks of the real path")
    sub = bench.add_subparsers(dest="bench_command", required=True)
    resize = sub.add_parser(
        "resize", help="critical path of rollout→train and train→rollout resizes (our "
        "executor, first-time and repeated group membership) against a naive restart from a "
        "checkpoint, for the tiny and a ~100M-parameter model, on 4 CPU devices")
    resize.add_argument("--models", default="tiny,100m",
                        help="comma-separated presets: tiny, 100m (default: both)")
    resize.add_argument("--repeats", type=int, default=3,
                        help="repetitions of the repeated-membership resizes (median)")
    resize.add_argument("--staging-bytes", type=int, metavar="N",
                        help="resize.staging_bytes (default: the config's)")
    resize.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="extra config override for every model (repeatable)")
    resize.add_argument("--no-naive", action="store_true", help="skip the naive resizes")
    resize.add_argument("--json", action="store_true", help="print one JSON object")
    resize.add_argument("--out", metavar="FILE.json", help="also write the JSON result here")
    resize.set_defaults(func=cmd_bench_resize)
    rollout = sub.add_parser(
        "rollout", help="the built-in rollout engine and vLLM side by side on the same model, "
        "prompts and device: tokens/s at 1/8/32/128 concurrent requests, time to first "
        "token, weight-update time (needs vLLM: bash scripts/setup.sh --with-vllm)")
    rollout.add_argument("--max-new-tokens", type=int, default=64,
                         help="tokens generated per request (default 64)")
    rollout.add_argument("--set", action="append", metavar="KEY=VALUE",
                         help="config override of the model (default: the tiny model with "
                         "model.num_heads=2, head_dim 32; repeatable)")
    rollout.add_argument("--write-results", metavar="FILE.md", nargs="?",
                         const="docs/results.md",
                         help="also write the section into FILE.md between the bench-rollout "
                         "markers (default docs/results.md)")
    rollout.add_argument("--json", action="store_true", help="print one JSON object")
    rollout.set_defaults(func=cmd_bench_rollout)
    chaos = sub.add_parser(
        "chaos", help="random device deaths in every phase, at 1024 simulated GPUs, each "
        "trial checked against the fault-free run (docs/faults.md; bench/chaos.py writes "
        "docs/results.md)")
    chaos.add_argument("--trials", type=int, default=300, help="trials (default 300)")
    chaos.add_argument("--first-seed", type=int, default=0, help="seed of the first trial")
    chaos.add_argument("--hangs", type=float, default=0.0, metavar="P",
                       help="each death a freeze (found by the watchdog's bound, "
                       "faults.hang_timeout_s) with probability P, 0..1 (default 0)")
    chaos.set_defaults(func=cmd_bench_chaos)
