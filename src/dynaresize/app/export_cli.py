"""`dynaresize export RUN_DIR --out DIR`: the command over `app.export` (kept apart so the
runner's `run.export_every` imports the export without the command line)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dynaresize.app.export import export_run
from dynaresize.cli import UsageError
from dynaresize.config import ConfigError


def cmd_export(args: argparse.Namespace) -> int:
    if Path(args.out).resolve() == Path(args.run_dir).resolve():
        raise UsageError("--out must not be the run directory itself")
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
