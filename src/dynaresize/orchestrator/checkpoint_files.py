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
   state.json        step K, seed, staleness, allocation, versions, files: written last
 run_dir/checkpoints/latest   "step-00000K", replaced atomically once state.json exists
```

Data position: prompts are a pure function of (seed, step), so the step is the data position.
Version K (the training state after K optimizer steps) is rebuilt on resume from the DCP files
and published again; version K-1 comes from its weight file; version 0 needs none.

Resume (`dynaresize train --resume DIR`): the run's config.toml plus `--set` overrides (the
number of devices may change; seed, staleness, model, task and train settings may not), the
trainers load the DCP state into their new sharding, the run directory drops the records of
steps >= K and appends.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dynaresize.config import Config

CKPT_DIR = "checkpoints"
LATEST = "latest"
STATE_FILE = "state.json"
FROZEN_SECTIONS = ("model", "task", "train")
FROZEN_KEYS = ("run.seed", "run.staleness")
"""What a resume may not change: it would change the samples or the update (design §2)."""


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


def checkpoint_dir(run_dir: Path, num_steps: int) -> Path:
    return run_dir / CKPT_DIR / f"step-{num_steps:06d}"


def read_latest(run_dir: str | os.PathLike[str]) -> tuple[Path, CheckpointState]:
    """The newest complete checkpoint of `run_dir`; ValueError names the file and the field."""
    root = Path(run_dir)
    if not root.is_dir():
        raise ValueError(f"{root}: run directory not found")
    latest = root / CKPT_DIR / LATEST
    if not latest.is_file():
        raise ValueError(f"{latest}: no checkpoint (set run.checkpoint_every > 0 to write one)")
    path = root / CKPT_DIR / latest.read_text().strip()
    state_file = path / STATE_FILE
    try:
        data = json.loads(state_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{state_file}: unreadable checkpoint state ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{state_file}: expected a JSON object")
    hints = {"num_steps": int, "seed": int, "staleness": int, "allocation": list,
             "weight_files": dict, "train_dir": str}
    for key, typ in hints.items():
        if not isinstance(data.get(key), typ) or isinstance(data.get(key), bool):
            raise ValueError(f"{state_file}: field {key!r} = {data.get(key)!r}: "
                             f"must be {typ.__name__}")
    state = CheckpointState(**{k: data[k] for k in hints})
    for name in [state.train_dir, *state.weight_files.values()]:
        if not (path / name).exists():
            raise ValueError(f"{path / name}: missing from the checkpoint")
    return path, state


def resume_overrides_ok(base: Config, resumed: Config) -> None:
    """Refuse overrides that would change the samples or the update (ConfigError)."""
    from dynaresize.config import ConfigError

    for sec in FROZEN_SECTIONS:
        if asdict(getattr(base, sec)) != asdict(getattr(resumed, sec)):
            raise ConfigError(sec, "changed on --resume",
                              "model, task and train settings must stay as in the run")
    for key in FROZEN_KEYS:
        sec, name = key.split(".")
        if getattr(getattr(base, sec), name) != getattr(getattr(resumed, sec), name):
            raise ConfigError(key, getattr(getattr(resumed, sec), name),
                              f"must stay {getattr(getattr(base, sec), name)!r} on --resume")
