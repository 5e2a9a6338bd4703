"""Execute a reshard plan (`resize.reshard`): the only module with the point-to-point calls.

Every device of old ∪ new members calls `execute_reshard` with the same plan, at an
optimizer-step boundary (no gradients pending). Each walks the plan in its global order and
takes part in the transfers that name it:

- local copy (src == dst == me): old shard rows -> new shard rows, no staging;
- send (src == me): old shard rows -> staging chunk -> blocking `dist.send` to dst;
- receive (dst == me): blocking `dist.recv` from src -> staging chunk -> new shard rows.

Why this cannot deadlock: take the first transfer of the global order that has not completed.
Both its ends have completed all their earlier transfers, so both are at this one, and it
completes. Devices are world ranks and messages go over the WORLD group (no subgroup needed).
Pairs that do not share a device run in parallel.

Staging goes through one preallocated byte buffer of at most `staging_bytes`, on the CPU for
gloo (its p2p calls take CPU tensors) or on the trainer's device otherwise, reused for every
chunk; a chunk above the bound (one row larger than `staging_bytes`) gets its own buffer while
it is live. `StagingArena` counts the bytes of the staging tensors that are alive at once: the
peak is measured, not derived from the plan.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from dynaresize.resize.reshard import Transfer, max_staged_chunk_bytes
from dynaresize.train.trainer import FSDPTrainer


@dataclass
class ReshardStats:
    """What one device did in one reshard."""

    bytes_sent: int = 0
    bytes_received: int = 0
    local_copy_bytes: int = 0
    num_sends: int = 0
    num_recvs: int = 0
    num_local_copies: int = 0
    peak_staging_bytes: int = 0
    """Most bytes of staging tensors alive at once on this device (measured)."""
    staging_bytes: int = 0
    """The configured bound."""
    reshard_s: float = 0.0
    """Wall time of this device's part, including waits for peers still reaching the reshard."""

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


class StagingArena:
    """Staging memory of one device: one reused buffer of `capacity_bytes`, allocated on first
    use; chunks larger than it get a dedicated buffer. Tracks live and peak allocated bytes."""

    def __init__(self, capacity_bytes: int, device: torch.device) -> None:
        self.capacity_bytes = capacity_bytes
        self.device = device
        self._buffer: torch.Tensor | None = None
        self._buffer_in_use = False
        self.live_bytes = 0
        self.peak_bytes = 0

    def _count(self, delta_bytes: int) -> None:
        self.live_bytes += delta_bytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def acquire(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous staging tensor of `shape` and `dtype`; give it back with `release`."""
        num_bytes = torch.Size(shape).numel() * dtype.itemsize
        if num_bytes > self.capacity_bytes or self._buffer_in_use:
            self._count(num_bytes)
            return torch.empty(shape, dtype=dtype, device=self.device)
        if self._buffer is None:
            self._buffer = torch.empty(self.capacity_bytes, dtype=torch.uint8, device=self.device)
            self._count(self.capacity_bytes)
        self._buffer_in_use = True
        return self._buffer[:num_bytes].view(dtype).view(shape)

    def release(self, chunk: torch.Tensor) -> None:
        """Return a tensor from `acquire` (the shared buffer stays allocated until `close`)."""
        if self._buffer is not None and chunk.untyped_storage().data_ptr() == \
                self._buffer.untyped_storage().data_ptr():
            self._buffer_in_use = False
        else:
            self.live_bytes -= chunk.numel() * chunk.element_size()

    def close(self) -> None:
        """Free the shared buffer."""
        if self._buffer is not None:
            self.live_bytes -= self.capacity_bytes
            self._buffer = None


def _rows(shard: torch.Tensor, rows: tuple[int, int], num_bytes: int) -> torch.Tensor:
    """Rows `[start, stop)` of a local shard, checked against the plan's layout."""
    view = shard[rows[0]:rows[1]]
    assert view.shape[0] == rows[1] - rows[0] and view.nbytes == num_bytes, \
        f"plan rows {rows} ({num_bytes} B) do not fit a local shard of shape {tuple(shard.shape)}"
    return view


def _prepare(old: FSDPTrainer | None, new: FSDPTrainer | None, optimizer_step: int) -> None:
    """Check the old state is at `optimizer_step`; give the new trainer its AdamW state."""
    if old is not None:
        if old.optimizer_step_count() != optimizer_step:
            raise ValueError(f"old trainer is at optimizer step {old.optimizer_step_count()}, "
                             f"the reshard expects {optimizer_step}")
        if not old.has_optimizer_state():  # before the first step: AdamW's moments are zeros
            old.init_optimizer_state(optimizer_step)
    if new is not None and (not new.has_optimizer_state()
                            or new.optimizer_step_count() != optimizer_step):
        new.init_optimizer_state(optimizer_step)


def _check_roles(plan: Sequence[Transfer], me: int, old: FSDPTrainer | None,
                 new: FSDPTrainer | None) -> None:
    if old is None and any(t.src_device == me for t in plan):
        raise ValueError(f"device {me} is an old member in the plan but has no old trainer")
    if new is None and any(t.dst_device == me for t in plan):
        raise ValueError(f"device {me} is a new member in the plan but has no new trainer")


def execute_reshard(plan: Sequence[Transfer], me: int, old: FSDPTrainer | None,
                    new: FSDPTrainer | None, optimizer_step: int,
                    staging_bytes: int) -> ReshardStats:
    """Run this device's part of `plan` (see module docstring); every device of old ∪ new
    members must call it with the same plan. Consumes this device's old trainer (if an old
    member; left unchanged) and its freshly built new trainer (if a new member; its shards and
    AdamW moments are overwritten, its step set to `optimizer_step`; with exact reduction its
    replica is then re-gathered, a collective over the new members). Produces this device's
    bytes, message counts, seconds and measured peak staging bytes."""
    if staging_bytes <= 0:
        raise ValueError(f"staging_bytes must be > 0, got {staging_bytes}")
    _check_roles(plan, me, old, new)
    t0 = time.perf_counter()
    _prepare(old, new, optimizer_step)
    src = old.local_shards(writable=False) if old is not None else {}
    dst = new.local_shards() if new is not None else {}
    any_trainer = old if old is not None else new
    stats = ReshardStats(staging_bytes=staging_bytes)
    if any_trainer is None:
        return stats
    gloo = dist.get_backend() == "gloo"
    arena = StagingArena(min(staging_bytes, max_staged_chunk_bytes(plan, me)),
                         torch.device("cpu") if gloo else any_trainer.device)
    with torch.no_grad():
        for t in plan:
            if t.is_local and t.src_device == me:
                _rows(dst[t.name], t.dst_local_rows, t.num_bytes).copy_(
                    _rows(src[t.name], t.src_local_rows, t.num_bytes))
                stats.local_copy_bytes += t.num_bytes
                stats.num_local_copies += 1
            elif t.src_device == me:
                rows = _rows(src[t.name], t.src_local_rows, t.num_bytes)
                chunk = arena.acquire(tuple(rows.shape), rows.dtype)
                chunk.copy_(rows)
                dist.send(chunk, dst=t.dst_device)
                arena.release(chunk)
                stats.bytes_sent += t.num_bytes
                stats.num_sends += 1
            elif t.dst_device == me:
                rows = _rows(dst[t.name], t.dst_local_rows, t.num_bytes)
                chunk = arena.acquire(tuple(rows.shape), rows.dtype)
                dist.recv(chunk, src=t.src_device)
                rows.copy_(chunk)
                arena.release(chunk)
                stats.bytes_received += t.num_bytes
                stats.num_recvs += 1
    arena.close()
    if new is not None:
        new.sync_replica()  # collective over the new group (exact reduction; else a no-op)
    stats.peak_staging_bytes = arena.peak_bytes
    stats.reshard_s = time.perf_counter() - t0
    return stats
