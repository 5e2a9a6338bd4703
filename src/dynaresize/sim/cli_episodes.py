"""The multi-turn flags of `dynaresize calibrate` and `dynaresize simulate` (sim.episodes).

    dynaresize calibrate --episodes SUMMARY.json --max-turns N [--out FILE]
    dynaresize simulate --episodes FILE [--workload PRESET] ...

`calibrate --episodes` fits an `EpisodeModel` (turns per episode, model and observation tokens
per turn, tool latency) to a live run's timing summary (`envs.driver.timing_summary`, e.g.
docs/data/agentic_timing.json from bench/agentic_turns.py) and writes it as JSON;
`simulate --episodes FILE` runs that model's episodes over a preset's batch and prompt lengths
(`--workload`, default `agentic`) on the twin's multi-turn engine (sim.engine_turns).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dynaresize.cli import UsageError, check_out_file

EPISODE_PRESETS = ("agentic-turns",)


def add_simulate_flags(sim: argparse.ArgumentParser) -> None:
    sim.add_argument("--episodes", metavar="FILE", help="multi-turn episodes: an episode "
                     "model from `dynaresize calibrate --episodes` over --workload's batch "
                     "and prompts (default agentic); a turn is a request, tools wait off the "
                     "engine")


def add_calibrate_flags(cal: argparse.ArgumentParser) -> None:
    cal.add_argument("--episodes", metavar="SUMMARY.json", help="fit the twin's multi-turn "
                     "episode model to a live run's timing summary (envs.driver."
                     "timing_summary; e.g. docs/data/agentic_timing.json) instead of RUN_DIR")
    cal.add_argument("--max-turns", type=int, metavar="N", help="with --episodes: the live "
                     "environment's turn limit (default: the summary's max_turns)")


def episode_workload_from_args(args: argparse.Namespace) -> Any:
    """The `--episodes FILE` workload (None without the flag); ValueError on bad input."""
    if not getattr(args, "episodes", None):
        return None
    from dynaresize.sim.episodes import episode_workload, load_episode_model
    from dynaresize.sim.workloads import PRESETS

    if args.from_run:
        raise ValueError("--episodes and --from-run: give one (a live run's samples are "
                         "single-turn)")
    inner = args.workload or "agentic"
    if inner not in PRESETS:
        raise ValueError(f"--workload {inner!r} with --episodes: the batch and prompts come "
                         f"from a synthetic preset: {', '.join(PRESETS)}")
    return episode_workload(load_episode_model(args.episodes), inner, seed=args.seed,
                            requests_per_step=args.requests_per_step)


def default_policies(workload: Any) -> tuple[str, ...] | None:
    """Episodes: the default policies less the oracle (its bound has no tool time and decodes
    observations); None (the usual defaults) otherwise."""
    if getattr(workload, "episode_model", None) is None:
        return None
    from dynaresize.sim.run import default_policies as defaults

    return tuple(p for p in defaults() if p != "oracle")


def cmd_calibrate_episodes(args: argparse.Namespace) -> int:
    """`calibrate --episodes SUMMARY.json`: print and write the fitted episode model."""
    from dynaresize.sim.episodes import episode_model_from_summary

    if args.run_dir:
        raise UsageError("calibrate: give RUN_DIR or --episodes SUMMARY.json, not both")
    if args.max_turns is not None and args.max_turns < 1:
        raise UsageError(f"--max-turns {args.max_turns}: must be >= 1")
    path = Path(args.episodes)
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--episodes {path}: cannot read a timing summary ({exc})") from None
    if isinstance(summary, dict) and isinstance(summary.get("summary"), dict):
        summary = summary["summary"]  # bench/agentic_turns.py's file
    if not isinstance(summary, dict):
        raise UsageError(f"--episodes {path}: expected a JSON object (a timing summary)")
    out = Path(args.out) if args.out else path.with_name(path.stem + ".episode_model.json")
    check_out_file("--out", str(out))
    try:
        model = episode_model_from_summary(summary, args.max_turns, source=str(path))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out.write_text(json.dumps({"episode_model": model.to_json(),
                               "continue_probability": model.continue_probability()},
                              indent=2) + "\n")
    for key, value in model.to_json().items():
        print(f"{key:28s} {value}")
    print(f"written: {out} (dynaresize simulate --episodes {out})", file=sys.stderr)
    return 0
