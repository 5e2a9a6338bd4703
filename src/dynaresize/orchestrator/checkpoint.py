"""The checkpointer: saves at the optimizer-step boundary and restores on resume (the files
and their format: `dynaresize.orchestrator.checkpoint_files`). `NullCheckpointer` when
checkpoints are off."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from dynaresize.config import Config
from dynaresize.core.dynamic_sampling import kept_filter_rates
from dynaresize.core.rundir import RunDir
from dynaresize.orchestrator.checkpoint_files import (
    CKPT_DIR,
    LATEST,
    STATE_FILE,
    CheckpointState,
    CheckpointWriteError,
    checkpoint_dir,
    manifest,
)
from dynaresize.orchestrator.state import RunState
from dynaresize.protocols import Clock, WeightHandle


class WeightIO(Protocol):
    """Moves full weights between a `WeightHandle` and a file (Ray + torch on the real
    backend, `app.runner.RayWeightIO`; the twin's `sim.harness.SimWeightIO`). Blocking: run
    in a thread."""

    def save(self, handle: WeightHandle, path: Path) -> None: ...

    def load(self, path: Path) -> WeightHandle: ...


@dataclass(frozen=True)
class CheckpointTarget:
    """Where and how often a run checkpoints; `weight_io` writes and reads full weights."""

    run_dir: str | os.PathLike[str]
    every: int
    weight_io: WeightIO


class NullCheckpointer:
    """Checkpoints off: never due, nothing to drain."""

    num_saved = 0

    def due(self, num_steps: int) -> bool:
        return False

    async def save(self, num_steps: int) -> str:
        raise RuntimeError("checkpoints are off")

    async def restore(self, path: Path, state: CheckpointState
                      ) -> tuple[str, list[tuple[int, WeightHandle]]]:
        raise RuntimeError("checkpoints are off: nothing to resume from")

    async def drain(self) -> None:
        return None

    def write_error(self, num_steps: int, exc: BaseException) -> Exception:
        return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


class Checkpointer:
    """Saves checkpoints from the train loop and restores them on resume."""

    def __init__(self, target: CheckpointTarget, cfg: Config, state: RunState, clock: Clock,
                 rundir: RunDir) -> None:
        self.run_dir = Path(target.run_dir)
        self.every = target.every
        self.weight_io = target.weight_io
        self.cfg = cfg
        self.state = state
        self.clock = clock
        self.rundir = rundir
        self.num_saved = 0
        self.last_complete = ""
        """The newest checkpoint written whole by this run ('' if none yet)."""
        self._latest_steps = -1
        """The steps of the checkpoint `latest` names (two background writes may overlap:
        an older one ending last must not move it back)."""
        self._pending: list[asyncio.Future[None]] = []

    def due(self, num_steps: int) -> bool:
        return self.every > 0 and num_steps % self.every == 0

    async def save(self, num_steps: int) -> str:
        """At the boundary after `num_steps` steps (train lock held): the DCP save is a
        collective of the training group; the rest finishes in the background. Returns the
        DCP directory (complete on return: a recovery point, see `recovery`)."""
        self._reap()  # a background write that failed stops the run here
        path = checkpoint_dir(self.run_dir, num_steps)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self.write_error(num_steps, exc) from exc
        t0 = self.clock.now()
        trainers = self.state.train_devices()
        stats = await asyncio.gather(*(d.save_checkpoint(str(path / "train")) for d in trainers))
        t1 = self.clock.now()
        num_bytes = int(max(s.get("checkpoint_bytes", 0) for s in stats))
        for i, d in enumerate(trainers):  # the files' bytes, counted once
            self.rundir.event(t0, t1, d.index, "checkpoint", critical=True,
                              num_bytes=num_bytes if i == 0 else 0, step=num_steps - 1)
        cfg = self.cfg
        state = CheckpointState(num_steps, cfg.run.seed, cfg.run.staleness,
                                [r.value for r in self.state.allocation.roles],
                                filter_rates=kept_filter_rates(self.state.filter_rates,
                                                               num_steps, cfg.run.staleness))
        handles: dict[int, Any] = {}
        for version in range(max(0, num_steps - cfg.run.staleness), num_steps):
            if version > 0:
                handles[version] = self.state.versions.get(version)
                state.weight_files[str(version)] = f"weights-v{version}.pt"
        self._pending.append(asyncio.ensure_future(self._finish(path, state, handles)))
        return str(path / "train")

    async def _finish(self, path: Path, state: CheckpointState, handles: dict[int, Any]) -> None:
        file = path
        try:
            for version, handle in handles.items():
                file = path / state.weight_files[str(version)]
                await asyncio.to_thread(self.weight_io.save, handle, file)
            file = path
            state.files = await asyncio.to_thread(manifest, path)
            file = path / STATE_FILE
            _write_atomic(file, json.dumps(asdict(state), indent=2) + "\n")
            file = self.run_dir / CKPT_DIR / LATEST
            if state.num_steps > self._latest_steps:
                _write_atomic(file, path.name + "\n")
                self._latest_steps = state.num_steps
        except OSError as exc:  # e.g. ENOSPC: `latest` still names the last complete one
            raise self.write_error(state.num_steps, exc, file) from exc
        if state.num_steps == self._latest_steps:
            self.last_complete = path.name
        self.num_saved += 1

    def write_error(self, num_steps: int, exc: BaseException,
                    file: Path | None = None) -> CheckpointWriteError:
        """The error that stops a run whose checkpoint after `num_steps` steps failed."""
        where = file or checkpoint_dir(self.run_dir, num_steps)
        kept = self.last_complete or "none yet (this run wrote no complete checkpoint)"
        return CheckpointWriteError(
            f"{where}: the checkpoint after step {num_steps - 1} could not be written "
            f"({type(exc).__name__}: {exc}); the last complete checkpoint, {kept}, is "
            f"intact: free space and continue with `dynaresize train --resume {self.run_dir}`")

    def _reap(self) -> None:
        """Raise the error of a background write that failed (`_finish`)."""
        for future in [f for f in self._pending if f.done()]:
            self._pending.remove(future)
            future.result()

    async def drain(self) -> None:
        """Wait for background writes (end of run)."""
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending)

    async def restore(self, path: Path, state: CheckpointState
                      ) -> tuple[str, list[tuple[int, WeightHandle]]]:
        """Load the DCP state into the (new) training group; returns its path and the versions
        the next rollouts need, for the train loop to publish: K - 1 from its file (staleness
        1), K from the loaded trainers."""
        k = state.num_steps
        self.last_complete, self._latest_steps = path.name, k
        t0 = self.clock.now()
        trainers = self.state.train_devices()
        await asyncio.gather(*(d.load_checkpoint(str(path / state.train_dir), k)
                               for d in trainers))
        published: list[tuple[int, WeightHandle]] = []
        for version_text, name in sorted(state.weight_files.items(), key=lambda kv: int(kv[0])):
            handle = await asyncio.to_thread(self.weight_io.load, path / name)
            published.append((int(version_text), handle))
        handles = await asyncio.gather(*(d.publish_weights(k) for d in trainers))
        published.append((k, handles[0]))
        t1 = self.clock.now()
        for d in trainers:
            self.rundir.event(t0, t1, d.index, "restore", critical=True, step=k)
        return str(path / state.train_dir), published


def _write_atomic(file: Path, text: str) -> None:
    """Write `text` to `file` through a temporary file and a rename: a reader sees the old
    content or the new, never a part (a disk full mid-write leaves the old one)."""
    tmp = file.with_name(file.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)
