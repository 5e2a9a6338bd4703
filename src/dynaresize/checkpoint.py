"""Checkpoints and resume (driver side): what is saved, when, and how a run continues.

Every `run.checkpoint_every` steps, at the optimizer-step boundary right after step K-1's
update (the orchestrator holds the train lock, so no resize and no other collective runs):

```
 run_dir/checkpoints/step-00000K/
   train/            DCP: each training rank writes its own shards of model + AdamW state
                     (`train.checkpoint`); critical (a collective of the training group)
   weights-v{K-1}.pt full weights of version K-1 when staleness = 1 (the rollout of step K
                     needs them); already on the driver, written off the critical path
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

import asyncio
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CKPT_DIR = "checkpoints"
LATEST = "latest"
STATE_FILE = "state.json"
FROZEN_SECTIONS = ("model", "task", "train")
FROZEN_KEYS = ("run.seed", "run.staleness")
"""What a resume may not change: it would change the samples or the update (DESIGN §2)."""


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


class Checkpointer:
    """Saves checkpoints from the orchestrator's train loop and restores them on resume.

    `weight_io` moves full weights between a WeightHandle and a file (Ray + torch on the real
    backend): `save(handle, path)` (blocking; run in a thread), `load(path) -> handle`."""

    def __init__(self, run_dir: str | os.PathLike[str], every: int, weight_io: Any) -> None:
        self.run_dir = Path(run_dir)
        self.every = every
        self.weight_io = weight_io
        self.num_saved = 0
        self._pending: list[asyncio.Future[None]] = []

    def due(self, num_steps: int) -> bool:
        return self.every > 0 and num_steps % self.every == 0

    async def save(self, orch: Any, num_steps: int) -> str:
        """At the boundary after `num_steps` steps (train lock held): the DCP save is a
        collective of the training group; the rest finishes in the background. Returns the
        DCP directory (complete on return: a recovery point, see `recovery`)."""
        path = checkpoint_dir(self.run_dir, num_steps)
        path.mkdir(parents=True, exist_ok=True)
        t0 = orch.clock.now()
        trainers = orch._train_devices()
        stats = await asyncio.gather(*(d.save_checkpoint(str(path / "train")) for d in trainers))
        t1 = orch.clock.now()
        num_bytes = int(max(s.get("checkpoint_bytes", 0) for s in stats))
        for i, d in enumerate(trainers):  # the files' bytes, counted once
            orch.rundir.event(t0, t1, d.index, "checkpoint", critical=True,
                              num_bytes=num_bytes if i == 0 else 0, step=num_steps - 1)
        cfg = orch.cfg
        state = CheckpointState(num_steps, cfg.run.seed, cfg.run.staleness,
                                [r.value for r in orch.allocation.roles])
        handles: dict[int, Any] = {}
        for version in range(max(0, num_steps - cfg.run.staleness), num_steps):
            if version > 0:
                handles[version] = orch.versions.get(version)
                state.weight_files[str(version)] = f"weights-v{version}.pt"
        self._pending.append(asyncio.ensure_future(self._finish(path, state, handles)))
        return str(path / "train")

    async def _finish(self, path: Path, state: CheckpointState, handles: dict[int, Any]) -> None:
        for version, handle in handles.items():
            await asyncio.to_thread(self.weight_io.save, handle,
                                    path / state.weight_files[str(version)])
        (path / STATE_FILE).write_text(json.dumps(asdict(state), indent=2) + "\n")
        tmp = self.run_dir / CKPT_DIR / (LATEST + ".tmp")
        tmp.write_text(path.name + "\n")
        os.replace(tmp, self.run_dir / CKPT_DIR / LATEST)
        self.num_saved += 1

    async def drain(self) -> None:
        """Wait for background writes (end of run)."""
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending)

    async def restore(self, orch: Any, path: Path, state: CheckpointState) -> str:
        """Load the DCP state into the (new) training group and publish the versions the next
        rollouts need: K - 1 from its file (staleness 1), K from the loaded trainers."""
        k = state.num_steps
        t0 = orch.clock.now()
        trainers = orch._train_devices()
        await asyncio.gather(*(d.load_checkpoint(str(path / state.train_dir), k)
                               for d in trainers))
        for version_text, name in sorted(state.weight_files.items(), key=lambda kv: int(kv[0])):
            handle = await asyncio.to_thread(self.weight_io.load, path / name)
            await orch.versions.publish(int(version_text), handle)
        handles = await asyncio.gather(*(d.publish_weights(k) for d in trainers))
        await orch.versions.publish(k, handles[0])
        t1 = orch.clock.now()
        for d in trainers:
            orch.rundir.event(t0, t1, d.index, "restore", critical=True, step=k)
        return str(path / state.train_dir)


def resume_overrides_ok(base: Any, resumed: Any) -> None:
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
