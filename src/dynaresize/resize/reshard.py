"""Reshard planner (pure, no torch): move dim-0 sharded training state from group G to G'.

FSDP2 shards every tensor on dim 0 exactly like `torch.chunk(t, R, dim=0)` (padded with empty
chunks, `torch.distributed.fsdp._fully_shard._fsdp_common._chunk_with_empty`): with
`c = ceil(N / R)` rows per chunk, rank r of R owns rows `[min(r c, N), min((r + 1) c, N))`, so
trailing ranks may own fewer or zero rows. Group rank r is the r-th smallest device of the group.

`plan_reshard` intersects the old owners' row ranges with the new owners' for every tensor and
cuts each intersection into chunks of at most `staging_bytes` (at least one row): one `Transfer`
per chunk, in one global order that every device walks identically (name order, then global row
order). A transfer whose source and destination are the same device is a local copy and needs no
staging. Nobody ever holds more than its own shard plus one staging chunk: the full state is
never gathered on one device.

Names: the caller's tensor names; optimizer moments are `f"{param}::exp_avg"` and
`f"{param}::exp_avg_sq"` (`with_optimizer_state`). The scalar AdamW `step` is not planned: every
device of the new group already knows the optimizer step count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod

OPTIM_STATE_KEYS = ("exp_avg", "exp_avg_sq")
"""AdamW state tensors that share their parameter's shape and sharding."""

Shapes = Mapping[str, tuple[tuple[int, ...], int]]
"""Tensor name -> (full shape, bytes per element)."""


@dataclass(frozen=True)
class Transfer:
    """One chunk of rows of one tensor, from its old owner to its new owner.

    Row ranges are half-open `(start, stop)`; `global_rows` index the full tensor, the local
    ones index the source's old shard and the destination's new shard (same length)."""

    name: str
    src_device: int
    dst_device: int
    global_rows: tuple[int, int]
    src_local_rows: tuple[int, int]
    dst_local_rows: tuple[int, int]
    num_bytes: int

    @property
    def is_local(self) -> bool:
        """True for a copy inside one device (no message, no staging)."""
        return self.src_device == self.dst_device

    @property
    def num_rows(self) -> int:
        return self.global_rows[1] - self.global_rows[0]


@dataclass(frozen=True)
class DeviceBytes:
    """Bytes one device sends, receives and copies locally under a plan."""

    sent_bytes: int = 0
    received_bytes: int = 0
    local_copy_bytes: int = 0


def optim_state_name(param_name: str, key: str) -> str:
    """Plan name of AdamW state `key` ("exp_avg" | "exp_avg_sq") of parameter `param_name`."""
    return f"{param_name}::{key}"


def with_optimizer_state(param_shapes: Shapes) -> dict[str, tuple[tuple[int, ...], int]]:
    """Parameter shapes -> the same plus each parameter's AdamW moments (same shape, dtype)."""
    out = dict(param_shapes)
    for name, spec in param_shapes.items():
        for key in OPTIM_STATE_KEYS:
            out[optim_state_name(name, key)] = spec
    return out


def shard_rows(num_rows: int, num_ranks: int, rank: int) -> tuple[int, int]:
    """Global dim-0 rows `(start, stop)` that FSDP2 gives group rank `rank` of `num_ranks`."""
    if num_ranks <= 0 or not 0 <= rank < num_ranks:
        raise ValueError(f"rank {rank} is not in a group of {num_ranks}")
    rows_per_rank = -(-num_rows // num_ranks)
    return min(rank * rows_per_rank, num_rows), min((rank + 1) * rows_per_rank, num_rows)


def row_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of one dim-0 row of a tensor of `shape` (elements of `itemsize` bytes)."""
    return prod(shape[1:]) * itemsize


def _check_members(label: str, members: Sequence[int]) -> tuple[int, ...]:
    out = tuple(members)
    if not out:
        raise ValueError(f"{label} is empty: a training group needs at least one device")
    if list(out) != sorted(set(out)) or out[0] < 0:
        raise ValueError(f"{label} must be sorted, distinct device indices >= 0, got {out}")
    return out


def _check_shape(name: str, shape: tuple[int, ...], itemsize: int) -> None:
    if len(shape) == 0:
        raise ValueError(f"tensor {name!r} is a scalar: FSDP shards on dim 0, so it needs one")
    if any(d < 0 for d in shape) or itemsize <= 0:
        raise ValueError(f"tensor {name!r}: bad shape {shape} or itemsize {itemsize}")


def _overlaps(num_rows: int, old: tuple[int, ...], new: tuple[int, ...]
              ) -> list[tuple[int, int, int, int, int, int]]:
    """(src_device, dst_device, start, stop, src_start, dst_start) for every non-empty
    intersection of an old and a new shard, in global row order."""
    old_ranges = [(d, *shard_rows(num_rows, len(old), r)) for r, d in enumerate(old)]
    new_ranges = [(d, *shard_rows(num_rows, len(new), r)) for r, d in enumerate(new)]
    out = []
    for src, src_start, src_stop in old_ranges:
        for dst, dst_start, dst_stop in new_ranges:
            start, stop = max(src_start, dst_start), min(src_stop, dst_stop)
            if start < stop:
                out.append((src, dst, start, stop, src_start, dst_start))
    out.sort(key=lambda o: o[2])
    return out


def plan_reshard(shapes: Shapes, old_members: Sequence[int], new_members: Sequence[int],
                 staging_bytes: int) -> list[Transfer]:
    """Consumes full shapes (name -> (shape, itemsize)), the old and new groups (sorted device
    indices) and the staging bound in bytes; produces every transfer that moves the old layout
    into the new one, each of at most `staging_bytes` (or one row, if a row is larger), in the
    global order all devices execute. Tensors with no bytes produce no transfers."""
    old = _check_members("old_members", old_members)
    new = _check_members("new_members", new_members)
    if staging_bytes <= 0:
        raise ValueError(f"staging_bytes must be > 0, got {staging_bytes}")
    plan: list[Transfer] = []
    for name in sorted(shapes):
        shape, itemsize = shapes[name]
        _check_shape(name, tuple(shape), itemsize)
        bytes_per_row = row_bytes(tuple(shape), itemsize)
        if bytes_per_row == 0:
            continue
        rows_per_chunk = max(1, staging_bytes // bytes_per_row)
        for src, dst, start, stop, src_start, dst_start in _overlaps(shape[0], old, new):
            for a in range(start, stop, rows_per_chunk):
                b = min(a + rows_per_chunk, stop)
                plan.append(Transfer(name, src, dst, (a, b), (a - src_start, b - src_start),
                                     (a - dst_start, b - dst_start), (b - a) * bytes_per_row))
    return plan


def bytes_by_device(plan: Sequence[Transfer]) -> dict[int, DeviceBytes]:
    """Per device of the plan: bytes it sends, receives, and copies locally."""
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    local: dict[int, int] = {}
    for t in plan:
        if t.is_local:
            local[t.src_device] = local.get(t.src_device, 0) + t.num_bytes
        else:
            sent[t.src_device] = sent.get(t.src_device, 0) + t.num_bytes
            received[t.dst_device] = received.get(t.dst_device, 0) + t.num_bytes
    devices = sorted(set(sent) | set(received) | set(local))
    return {d: DeviceBytes(sent.get(d, 0), received.get(d, 0), local.get(d, 0))
            for d in devices}


def max_staged_chunk_bytes(plan: Sequence[Transfer], device: int) -> int:
    """Largest non-local chunk `device` sends or receives: the staging it needs at once."""
    return max((t.num_bytes for t in plan if not t.is_local
                and device in (t.src_device, t.dst_device)), default=0)
