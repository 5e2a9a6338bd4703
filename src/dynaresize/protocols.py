"""The backend seams: `Clock` and `Device`. The orchestrator talks to nothing else.

Real (`RayDevice`, `RealClock`) and simulated (`SimDevice`, `VirtualClock`) implementations sit
side by side; the orchestrator never imports Ray or torch.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol, runtime_checkable

from dynaresize.types import Completion, InflightRequest, RequestSpec, Role, TrainSample


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary origin (monotonic)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


WeightHandle = Any
"""Opaque handle of published weights (a Ray ObjectRef for real devices, the version for sim)."""


@runtime_checkable
class Device(Protocol):
    """One GPU or CPU slot, long-lived, switching roles without restarting."""

    index: int
    role: Role

    async def start(self) -> None:
        """Bring the device up (process, world group, model) before the first step."""
        ...

    # ------------------------------------------------------------------ rollout role
    async def load_weights(self, version: int, weights: WeightHandle) -> None:
        """Install policy `version` in the rollout engine."""
        ...

    async def submit(self, requests: list[RequestSpec | InflightRequest]) -> None:
        """Queue requests (new or migrated) on the rollout engine."""
        ...

    async def run_rollout(self, max_s: float, until_empty: bool = False) -> list[Completion]:
        """Run decode iterations until at least one request finishes (`until_empty`: until
        none is left), `max_s` passes, or the engine is empty; return what finished."""
        ...

    async def export_inflight(self) -> list[InflightRequest]:
        """Remove every queued and running request, with its token prefix and sampler state."""
        ...

    # ------------------------------------------------------------------ train role
    async def join_train_group(self, members: tuple[int, ...], generation: int) -> None:
        """Become a rank of the training group `members` (sorted device indices)."""
        ...

    async def train_step(self, step: int, micro_batches: list[list[TrainSample] | None],
                         global_num_tokens: int) -> dict[str, float]:
        """One optimizer step over this rank's micro-batches (None: a padding micro-batch)."""
        ...

    async def train_accumulate(self, step: int,
                               micro_batches: list[tuple[int, list[TrainSample]]]) -> None:
        """Local: compute and hold the gradients of these (index, micro-batch) pairs of
        `step` (streaming, `dynaresize.stream`); held gradients survive training-group
        changes and are dropped when the device leaves training."""
        ...

    async def train_finish(self, step: int, num_micro_batches: int,
                           global_num_tokens: int) -> dict[str, float]:
        """Collective over the training group: combine the held gradients of micro-batches
        0..num_micro_batches-1 (each held by exactly one rank) in index order, one optimizer
        step."""
        ...

    async def publish_weights(self, version: int) -> WeightHandle | None:
        """Collective over the training group; the group's first rank returns the handle."""
        ...

    async def param_checksum(self) -> tuple[float, str]:
        """Collective over the training group: (sum of parameters as float64, SHA-256)."""
        ...

    # ------------------------------------------------------------------ resize ops (DESIGN §4)
    async def release_kv(self) -> None:
        """Free the rollout engine's KV cache (the engine is empty)."""
        ...

    async def release_rollout_weights(self) -> None:
        """Drop the rollout engine and its weights."""
        ...

    async def alloc_kv(self) -> None:
        """Make the rollout engine ready to serve (after `load_weights`)."""
        ...

    async def join_group(self, members: tuple[int, ...]) -> bool:
        """Every device calls this with the same members, in the same order (communicator
        cache). Returns True if a group had to be created (False: reused)."""
        ...

    async def reshard(self, old_members: tuple[int, ...], new_members: tuple[int, ...],
                      generation: int, optimizer_step: int, staging_bytes: int
                      ) -> dict[str, float]:
        """Called on every device of old ∪ new members: move parameter and optimizer shards
        from the old group's layout to the new group's through a staging buffer of at most
        `staging_bytes`; new members hold the new state beside the old until `commit`."""
        ...

    async def commit_train_group(self, new_members: tuple[int, ...]) -> None:
        """Switch to the trainer prepared by `reshard` (members) or stop training (others)."""
        ...

    async def abort_reshard(self) -> None:
        """Discard what `reshard` prepared; the old trainer stays in charge."""
        ...

    async def drop_trainer(self) -> None:
        """Free a former training device's old trainer state."""
        ...

    async def stop(self) -> None: ...
