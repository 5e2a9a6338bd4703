"""`dynaresize export RUN_DIR --out DIR`: the command over `app.export` (kept apart so the
runner's `run.export_every` imports the export without the command line)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dynaresize.app.export import export_run
from dynaresize.cli import UsageError, check_out_dir
from dynaresize.config import ConfigError


def check_export_out(run_dir: str, out: str) -> None:
    """`--out DIR` before any work: a directory path that can be written, and, since the
    export replaces it, neither the run directory nor a folder holding it, nor a folder with
    other files than an earlier export (UsageError, one line)."""
    check_out_dir("--out", out, replaced=True)
    target, run = Path(out).resolve(), Path(run_dir).resolve()
    if target == run or target in run.parents:
        raise UsageError(f"--out {out}: holds the run directory {run_dir}; the export replaces "
                         "--out, give a folder of its own")
    if target.is_dir() and any(target.iterdir()) and not (target / "config.json").is_file():
        raise UsageError(f"--out {out}: a folder with other files than an earlier export; the "
                         "export replaces --out, give a new folder")


def cmd_export(args: argparse.Namespace) -> int:
    check_export_out(args.run_dir, args.out)
    try:
        out = export_run(args.run_dir, args.out)
    except ConfigError:
        raise
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"exported {args.run_dir} to {out} (transformers and vLLM load it as it is)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("export", help="write a finished run's model as a Hugging Face "
                            "folder (config, safetensors, tokenizer, generation config)")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a `dynaresize train` run directory")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write")
    parser.set_defaults(func=cmd_export)
