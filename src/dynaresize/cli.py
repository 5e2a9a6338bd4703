"""The `dynaresize` command. Arguments are parsed and the config validated before torch or Ray
is imported, so bad input fails in milliseconds with exit code 2 and nothing started."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dynaresize.config import Config, ConfigError, load_config, to_toml
from dynaresize.config.literal import toml_repr
from dynaresize.control.registry import check_policy
from dynaresize.core.rundir import CheckpointWriteError
from dynaresize.model_sources import missing_requirement

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input (exit code 2, no traceback)."""


def _default_out(kind: str) -> str:
    return str(Path("runs") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


def _resume_config(args: argparse.Namespace) -> Config:
    """The run's own config.toml plus `--set` overrides; refuse what a resume cannot change
    (`config.resume`) and a `run.steps` the checkpoint already reached."""
    from dynaresize.config.resume import check_more_steps, check_resume_config
    from dynaresize.orchestrator.checkpoint_files import read_latest, started_without_checkpoint

    if args.config or args.out:
        raise UsageError("--resume DIR continues DIR with its own config.toml; "
                         "use --set to change e.g. allocation.num_train_devices")
    try:
        num_done = read_latest(args.resume)[1].num_steps
    except ValueError as exc:
        if not started_without_checkpoint(args.resume):  # else: it starts over
            raise UsageError(str(exc)) from None
        num_done = 0
    path = Path(args.resume) / "config.toml"
    if not path.is_file():
        raise UsageError(f"--resume {args.resume}: no config.toml in that run directory (a "
                         "`dynaresize train --out DIR` run directory has one)")
    base = load_config(path, [], check_machine=False)
    cfg = load_config(path, args.set or [], check_machine=not args.address,
                      check_packages=not args.dry_run)
    check_resume_config(base, cfg)
    check_more_steps(cfg.run.steps, num_done, args.resume)
    return cfg


def _nearest_existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _writable_dir(flag: str, given: str, path: Path) -> None:
    """UsageError unless `path` is a directory this process can create files in."""
    if not path.is_dir():
        raise UsageError(f"{flag} {given}: {path} is a file, not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {given}: directory {path} is not writable")


def check_out_dir(flag: str, given: str, *, replaced: bool = False) -> None:
    """An output directory (`--out DIR`), checked before any work: it must be an existing
    writable directory or one that can be created (its nearest existing ancestor is a
    writable directory). `replaced`: it is written beside itself and renamed into place
    (`export`), so it must name a folder and its parent must be writable too. UsageError
    names the flag, the path and what is wrong (one line)."""
    try:
        path = Path(given)
        if not given.strip():
            raise UsageError(f"{flag} {given!r}: give the path of a directory to write "
                             "(e.g. out/run-1)")
        if replaced and path.name in ("", ".", ".."):
            raise UsageError(f"{flag} {given!r}: names no folder of its own (it is replaced; "
                             "give e.g. out/model-hf)")
        if path.exists() and not path.is_dir():
            raise UsageError(f"{flag} {given}: exists and is not a directory (give a new "
                             "or existing directory)")
        if path.is_dir() and not replaced:
            _writable_dir(flag, given, path)
            return
        _writable_dir(flag, given, _nearest_existing(path.absolute().parent))
    except (OSError, ValueError) as exc:  # e.g. a name too long, a NUL byte
        raise UsageError(f"{flag} {given!r}: not a usable path ({exc})") from None


def check_out_file(flag: str, given: str, *, make_parents: bool = False) -> None:
    """An output file (`--out FILE.json`), checked before any work: not a directory, its
    directory existing and writable (`make_parents`: creatable). UsageError names the flag,
    the path and what is wrong (one line)."""
    try:
        path = Path(given)
        if not given.strip():
            raise UsageError(f"{flag} {given!r}: give the path of a file to write")
        if path.is_dir():
            raise UsageError(f"{flag} {given}: is a directory (give a file path)")
        parent = path.absolute().parent
        if not make_parents and not parent.exists():
            raise UsageError(f"{flag} {given}: directory {parent} does not exist")
        _writable_dir(flag, given, _nearest_existing(parent))
        if path.exists() and not os.access(path, os.W_OK):
            raise UsageError(f"{flag} {given}: file is not writable")
    except (OSError, ValueError) as exc:
        raise UsageError(f"{flag} {given!r}: not a usable path ({exc})") from None


def _check_task_data(cfg: Config) -> None:
    """Load the task's dataset now: a bad line, generator or field fails before any process
    starts (a `model.source` is materialised here, once, with progress: its tokenizer)."""
    from dynaresize.tasks import make_task, model_dir

    try:
        if cfg.model.source:
            model_dir(cfg, print)
        make_task(cfg)
    except ConfigError:
        raise
    except ValueError as exc:
        raise UsageError(f"task dataset: {exc}") from None


def cmd_train(args: argparse.Namespace) -> int:
    if args.address is not None:  # --address A is --set ray.address=A
        args.set = [*(args.set or []), f"ray.address={json.dumps(args.address)}"]
    if args.resume:
        cfg = _resume_config(args)
    else:
        cfg = load_config(args.config, args.set or [], check_machine=not args.address,
                          check_packages=not args.dry_run)
    check_policy(cfg)
    out = args.resume or args.out or _default_out("train")
    if args.out or not args.dry_run:  # before the task's data and any process
        check_out_dir("--resume" if args.resume else "--out", out)
    missing = missing_requirement(cfg.model.source) if cfg.model.source else None
    if not missing:
        _check_task_data(cfg)
    if args.dry_run:
        print(to_toml(cfg), end="")
        if missing:
            print(f"note: model.source = {toml_repr(cfg.model.source)} {missing}; a real run "
                  "needs it (the task's data was not checked)", file=sys.stderr)
        return 0
    from dynaresize.app.runner import run_training
    from dynaresize.rollout.spec_stats import acceptance_line

    summary = run_training(cfg, out, resume=bool(args.resume))
    print(f"done: {summary['steps']} steps in {summary['wall_s']:.1f}s, "
          f"final reward {summary['final_reward']:.3f}, {summary['tokens_per_s']:.0f} tokens/s, "
          f"bubble {summary['bubble_fraction']:.1%}; run directory: {out}")
    if "eval_accuracy_last" in summary:
        print(f"held-out accuracy {summary['eval_accuracy_first']:.3f} -> "
              f"{summary['eval_accuracy_last']:.3f}")
    acceptance = acceptance_line(summary.get("speculation"))
    if acceptance is not None:
        print(acceptance)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynaresize",
        description="RL post-training (GRPO) with Rollout and Training device pools.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="run RL training (embedded default: tiny model, "
                           "built-in task, 4 CPU devices, local Ray on loopback)")
    train.add_argument("--config", metavar="FILE.toml", help="TOML config file")
    train.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a config key, e.g. --set run.steps=4 (repeatable)")
    train.add_argument("--out", metavar="DIR", help="run directory (default: runs/train-<time>)")
    train.add_argument("--address", metavar="ADDR",
                       help="join the Ray cluster whose GCS is at HOST:PORT instead of "
                       "starting a local one (the same as --set ray.address=HOST:PORT)")
    train.add_argument("--resume", metavar="DIR",
                       help="continue run directory DIR from its latest checkpoint (any "
                       "number of devices: --set allocation.num_train_devices=...)")
    train.add_argument("--dry-run", action="store_true",
                       help="print the resolved config and exit")
    train.set_defaults(func=cmd_train)
    for register in _EXTRA_COMMANDS:
        register(sub)
    return parser


_EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []
"""Other subcommands register themselves here (simulate, report, bench)."""


def make_parser() -> argparse.ArgumentParser:
    """The whole `dynaresize` parser, every subcommand registered."""
    _load_extra_commands()
    return build_parser()


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, UsageError, CheckpointWriteError) as exc:
        print(f"dynaresize {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _load_extra_commands() -> None:
    if _EXTRA_COMMANDS:
        return
    import importlib

    for name in ("dynaresize.sim.cli", "dynaresize.app.report", "dynaresize.app.bench",
                 "dynaresize.app.export_cli"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        _EXTRA_COMMANDS.append(module.register)


if __name__ == "__main__":
    sys.exit(main())
