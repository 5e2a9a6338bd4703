"""The docs check's command lines: every `dynaresize ...` (and `bash scripts/...`) line the docs
show must parse, and README's command list must work when pasted in order.

- Every `--set section.key=...` names a config key.
- A synopsis (`dynaresize train [--config FILE.toml] [--set key=value …]`): its subcommand and
  every `--flag` exist.
- Any other line: `dynaresize`'s own argument parser accepts it (placeholders such as
  `HOST:PORT` are filled in first). In README.md it is also run, in-process: `train` lines with
  `--dry-run` added (the config, every `--set` and the task's data are validated; no device
  starts); the others only parse (they are long jobs). A line that needs an optional install
  (`--with-vllm` in its comment) and lacks it is only parsed.
- In README.md, a run directory a line reads (`report DIR`, `--resume DIR`, `calibrate DIR`,
  `--from-run DIR`) must be created by an earlier line's `--out DIR`.
- `bash scripts/X.sh --opt`: the script exists and mentions the option.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dynaresize.app.docs_index import Citation, Finding

PLACEHOLDERS = {"HOST:PORT": "127.0.0.1:6379"}
"""What the check substitutes for a placeholder before parsing a command line."""
SYNOPSIS = re.compile(r"\[|\||…|\.\.\.|<| / |\s[A-Z][A-Z_]*(\s|$)")
"""A synopsis, not a command: `[--opt]`, `a | b`, `…`, `<x>`, `a / b`, a placeholder (` N`)."""
READS_RUN_DIR = {"report": 0, "calibrate": 0}
"""Subcommands whose first positional argument is a run directory that must exist."""
OPTIONAL_INSTALLS = ("--with-vllm", "--with-real")
"""A README line whose comment names one of these set-up options needs packages a fresh
set-up lacks (and a slow model load): only its config is validated, not `--dry-run` run."""


@functools.cache
def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from dynaresize.cli import make_parser

    parser = make_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def all_options() -> set[str]:
    """Every option string of every `dynaresize` subcommand."""
    return {opt for sub in _subparsers().values() for opt in sub._option_string_actions}


def _parse_error(argv: list[str]) -> str | None:
    from dynaresize.cli import make_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            make_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code:
            return (err.getvalue().strip().splitlines() or ["does not parse"])[-1]
    return None


def _config_error(argv: list[str]) -> str | None:
    """The config of `dynaresize train ...` (file and `--set`) validated as on a machine
    without the optional installs: None, or the error."""
    from dynaresize.cli import make_parser
    from dynaresize.config import ConfigError, load_config
    from dynaresize.control.registry import check_policy

    args = make_parser().parse_args(argv)
    try:
        check_policy(load_config(args.config, args.set or [], check_machine=False,
                                 check_packages=False))
    except ConfigError as exc:
        return str(exc)
    return None


def _run_error(argv: list[str]) -> str | None:
    """`dynaresize train ... --dry-run` in-process: None, or its error line."""
    from dynaresize.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main([*argv, "--dry-run"])
    if code:
        return (err.getvalue().strip().splitlines() or [f"exit {code}"])[-1]
    return None


def _flags_only(c: Citation, tokens: list[str]) -> list[Finding]:
    from dynaresize.app.docs_index import Finding

    subs = _subparsers()
    if len(tokens) < 2 or tokens[1] not in subs:
        return [Finding(c.path, c.line, c.text, f"no subcommand {tokens[1:2]}; "
                        f"allowed: {', '.join(subs)}")]
    known = subs[tokens[1]]._option_string_actions
    flags = re.findall(r"(?<![\w-])--[\w-]+", " ".join(tokens[2:]))
    return [Finding(c.path, c.line, c.text, f"`dynaresize {tokens[1]}` has no option {f}")
            for f in flags if f not in known]


def _split(text: str) -> list[str] | None:
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return None


def _run_dirs_read(tokens: list[str]) -> list[str]:
    dirs = [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t in ("--resume", "--from-run")]
    if len(tokens) > 2 and tokens[1] in READS_RUN_DIR:
        positional = [t for t in tokens[2:] if not t.startswith("-")]
        dirs += positional[:1]
    return dirs


def _script_line(c: Citation, tokens: list[str], root: Path) -> list[Finding]:
    from dynaresize.app.docs_index import Finding

    script = root / tokens[1] if len(tokens) > 1 else root
    if not script.is_file():
        return [Finding(c.path, c.line, c.text, f"no such script {tokens[1:2]}")]
    text = script.read_text(encoding="utf-8")
    return [Finding(c.path, c.line, c.text, f"{tokens[1]} has no option {t}")
            for t in tokens[2:] if t.startswith("--") and t.split("=")[0] not in text]


def _set_keys(c: Citation, tokens: list[str]) -> list[Finding]:
    """Every `--set section.key=...` names a config key."""
    from dynaresize.app.docs_index import Finding, config_lookup

    bare = [t.strip("[]") for t in tokens]
    keys = [bare[i + 1].split("=")[0] for i, t in enumerate(bare[:-1]) if t == "--set"]
    return [Finding(c.path, c.line, c.text, f"--set {k}: no such config key")
            for k in keys if "." in k and not config_lookup(k)[0]]


def check_command(c: Citation, root: Path, run: bool, created: set[str]) -> list[Finding]:
    """Findings of one command line (`created`: run directories earlier lines wrote)."""
    from dynaresize.app.docs_index import Finding

    tokens = _split(c.text.removeprefix("$ "))
    if not tokens:
        return [Finding(c.path, c.line, c.text, "cannot split it as a shell line")]
    if tokens[0] == "bash":
        return _script_line(c, tokens, root)
    findings = _set_keys(c, tokens)
    if SYNOPSIS.search(c.text.split("#")[0]) or len(tokens) == 2:
        return findings + _flags_only(c, tokens)
    argv = tokens[1:]
    problem = _parse_error(argv)
    if problem:
        return findings + [Finding(c.path, c.line, c.text, f"does not parse: {problem}")]
    if run and not findings:
        for d in _run_dirs_read(tokens):
            if d not in created and not (root / d).exists():
                findings.append(Finding(c.path, c.line, c.text, f"reads {d}, which no earlier "
                                        f"line creates (add `--out {d}` to one)"))
        created.update(tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == "--out")
        if argv[0] == "train" and "--resume" not in argv and "--help" not in argv:
            optional = any(opt in c.text.partition("#")[2] for opt in OPTIONAL_INSTALLS)
            problem = _config_error(argv) if optional else _run_error(argv)
            if problem:
                findings.append(Finding(c.path, c.line, c.text, f"--dry-run fails: {problem}"))
    return findings


def is_command(c: Citation) -> bool:
    text = c.text.removeprefix("$ ")
    if c.kind == "code":
        return text.startswith(("dynaresize ", "bash scripts/"))
    return c.kind == "span" and text.startswith("dynaresize ")


def check_commands(cites: list[Citation], root: Path, counts: Counter[str],
                   run: bool) -> list[Finding]:
    """Every command line among `cites`, in order (README: run as pasted)."""
    created: set[str] = set()
    findings: list[Finding] = []
    for c in cites:
        if is_command(c):
            counts["command"] += 1
            findings += check_command(c, root, run and c.kind == "code", created)
    return findings
