"""Checkpoints and resume (driver side): what is saved, when, and how a run continues. The
files and their format live here; the saving and restoring, `orchestrator.checkpoint`.

Every `run.checkpoint_every` steps, at the optimizer-step boundary right after step K-1's
update (the orchestrator holds the train lock, so no resize and no other collective runs):

```
 run_dir/checkpoints/step-00000K/
   train/            DCP: each training rank writes its own shards of model + AdamW state
                     (`train.checkpoint`); critical (a collective of the training group)
   weights-v{V}.pt   full weights of versions K-s .. K-1 at staleness s (the rollouts of
                     steps K .. K+s-1 need them); on the driver, written off the critical path
   state.json        step K, seed, staleness, allocation, versions, files, the filter
                     rates a resume plans from (dynamic sampling): written last
 run_dir/checkpoints/latest   "step-00000K", replaced atomically once state.json exists
```

Data position: prompts are a pure function of (seed, step), so the step is the data position.
Version K (the training state after K optimizer steps) is rebuilt on resume from the DCP files
and published again; version K-1 comes from its weight file; version 0 needs none.

Resume (`dynaresize train --resume DIR`): the run's config.toml plus `--set` overrides (the
number of devices may change; what changes the samples or the update may not:
`config.resume.FROZEN_ON_RESUME`), the
trainers load the DCP state into their new sharding, the run directory drops the records of
steps >= K and appends.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynaresize.core.rundir import CheckpointWriteError

__all__ = ["CheckpointWriteError", "CheckpointState", "read_latest", "read_checkpoint",
           "manifest", "checkpoint_dir", "started_without_checkpoint"]

CKPT_DIR = "checkpoints"
LATEST = "latest"
STATE_FILE = "state.json"


@dataclass
class CheckpointState:
    """state.json: enough to continue the run at step `num_steps`."""

    num_steps: int
    """Steps done = version of the saved training state = the first step to run."""
    seed: int
    staleness: int
    allocation: list[str]
    weight_files: dict[str, str] = field(default_factory=dict)
    """Version (as a string, JSON keys) → weight file in the checkpoint directory."""
    train_dir: str = "train"
    files: dict[str, list[Any]] = field(default_factory=dict)
    """Relative path -> [size, sha256] of every file of the checkpoint (`manifest`)."""
    filter_rates: dict[str, float] = field(default_factory=dict)
    """Dynamic sampling: step (as a string) -> its filter rate on the exact rewards, for the
    steps a resume plans from (`core.dynamic_sampling.kept_filter_rates`); absent from older
    checkpoints (the resume then reads them from samples.jsonl)."""


def checkpoint_dir(run_dir: Path, num_steps: int) -> Path:
    return run_dir / CKPT_DIR / f"step-{num_steps:06d}"


def manifest(path: Path) -> dict[str, list[Any]]:
    """Every file under checkpoint directory `path` (but state.json): relative path ->
    [size in bytes, sha256]. Written into state.json, checked on resume."""
    files: dict[str, list[Any]] = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name != STATE_FILE):
        files[str(file.relative_to(path))] = [file.stat().st_size, sha256_of(file)]
    return files


def read_checkpoint(path: Path) -> CheckpointState:
    """The state of the checkpoint in `path` once checked complete: state.json readable and
    whole, every file it names present, with its recorded size and sha256; ValueError names
    the file and what is wrong."""
    state_file = path / STATE_FILE
    try:
        data = json.loads(state_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{state_file}: unreadable checkpoint state ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{state_file}: expected a JSON object")
    hints = {"num_steps": int, "seed": int, "staleness": int, "allocation": list,
             "weight_files": dict, "train_dir": str}
    for key, typ in hints.items():
        if not isinstance(data.get(key), typ) or isinstance(data.get(key), bool):
            raise ValueError(f"{state_file}: field {key!r} = {data.get(key)!r}: "
                             f"must be {typ.__name__}")
    files = data.get("files", {})
    if not isinstance(files, dict):
        raise ValueError(f"{state_file}: field 'files' must be a table")
    rates = data.get("filter_rates", {})
    if not isinstance(rates, dict) or not all(
            k.isdigit() and isinstance(v, (int, float)) and not isinstance(v, bool)
            and 0.0 <= v <= 1.0 for k, v in rates.items()):
        raise ValueError(f"{state_file}: field 'filter_rates' = {rates!r}: must be a table of "
                         "step -> rate in [0, 1]")
    state = CheckpointState(**{k: data[k] for k in hints}, files=files, filter_rates=rates)
    for name in [state.train_dir, *state.weight_files.values()]:
        if not (path / name).exists():
            raise ValueError(f"{path / name}: missing from the checkpoint")
    for name, entry in files.items():
        file = path / name
        if not file.is_file():
            raise ValueError(f"{file}: missing from the checkpoint")
        if not isinstance(entry, list) or len(entry) != 2:
            raise ValueError(f"{state_file}: files[{name!r}] = {entry!r}: must be [size, sha256]")
        size = file.stat().st_size
        if size != entry[0]:
            raise ValueError(f"{file}: {size} bytes, the checkpoint wrote {entry[0]} "
                             "(truncated or overwritten)")
        if sha256_of(file) != entry[1]:
            raise ValueError(f"{file}: content differs from what the checkpoint wrote "
                             "(sha256 mismatch: corrupted)")
    return state


def sha256_of(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def started_without_checkpoint(run_dir: str | os.PathLike[str]) -> bool:
    """A run directory of a run that stopped (e.g. its driver was killed) before its first
    checkpoint: its config.toml is there, no checkpoint is. `--resume` starts it over."""
    root = Path(run_dir)
    ckpt = root / CKPT_DIR
    return (root / "config.toml").is_file() and not (ckpt / LATEST).exists() \
        and not any((p / STATE_FILE).exists() for p in ckpt.glob("step-*"))


def read_latest(run_dir: str | os.PathLike[str], warn: Callable[[str], None] | None = None
                ) -> tuple[Path, CheckpointState]:
    """The newest complete checkpoint of `run_dir`: the one `latest` names if it checks out
    (`read_checkpoint`), else the newest older one that does (`warn` says which file was bad
    and which checkpoint is used instead). Nothing is deleted. ValueError (names the file) if
    no checkpoint is complete."""
    root = Path(run_dir)
    if not root.is_dir():
        raise ValueError(f"{root}: run directory not found")
    latest = root / CKPT_DIR / LATEST
    if not latest.is_file():
        raise ValueError(f"{latest}: no checkpoint (set run.checkpoint_every > 0 to write one)")
    problems: list[str] = []
    try:
        name = latest.read_text().strip()
        if not name.startswith("step-") or "/" in name or not (root / CKPT_DIR / name).is_dir():
            raise ValueError(f"{latest}: names {name[:60]!r}, not a checkpoint directory")
        candidates = [root / CKPT_DIR / name]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        problems.append(str(exc) if isinstance(exc, ValueError) else f"{latest}: {exc}")
        candidates = []
    newest = candidates[0].name if candidates else "step-999999999"
    candidates += sorted((p for p in (root / CKPT_DIR).glob("step-*")
                          if p.is_dir() and p.name < newest), reverse=True)
    for path in candidates:
        try:
            state = read_checkpoint(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if problems and warn is not None:
            warn(f"skipped an incomplete or corrupt checkpoint ({'; '.join(problems)}); "
                 f"resuming from {path.name}")
        return path, state
    raise ValueError("; ".join(problems) if problems else f"{root / CKPT_DIR}: no checkpoint")
