"""The backend seams: `Clock` and the device ops, split by role. The orchestrator talks to
nothing else.

Real (`RayDevice`, `RealClock`) and simulated (`SimDevice`, `VirtualClock`) implementations sit
side by side; the orchestrator never imports Ray or torch.

A device is one long-lived slot (`DeviceSlot`: index, role, start, stop) that plays several
roles over a run; each role's ops form one protocol, so a component can name the ops it uses:

- `RolloutOps`: serve the policy (load weights, submit, run, export requests);
- `TrainOps`: one rank of the training group (steps, streamed steps, publish weights);
- `ResizeOps`: the fine-grained ops of a resize (design §4), run by `resize.executor`;
- `RecoveryOps`: checkpoints and a new world after a device death (`recovery`, `checkpoint`).

`ProcessTable` (kill, is_alive, new_store) is the backend's view of the device processes that
fault injection and recovery ask besides the devices. `Device` is all four role protocols
(what the orchestrator holds). It lists every member again instead of inheriting from the
four (a class with several project bases reads as a mixin here); tests/unit/test_protocols.py
checks that it is exactly their union, signature for signature, and that `RayDevice` and
`SimDevice` implement every op (`DevicePool` and `SimProcesses` the `ProcessTable`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol, runtime_checkable

from dynaresize.core.types import Completion, InflightRequest, RequestSpec, Role, TrainSample


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
class DeviceSlot(Protocol):
    """One GPU or CPU slot, long-lived, switching roles without restarting."""

    index: int
    role: Role

    async def start(self) -> None:
        """Bring the device up (process, world group, model) before the first step."""
        ...

    async def stop(self) -> None: ...


@runtime_checkable
class RolloutOps(DeviceSlot, Protocol):
    """The rollout role: a continuous-batching engine serving one policy version."""

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


@runtime_checkable
class TrainOps(DeviceSlot, Protocol):
    """The train role: one rank of the training group."""

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
        `step` (streaming, `dynaresize.core.stream`); held gradients survive training-group
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


@runtime_checkable
class ResizeOps(DeviceSlot, Protocol):
    """The ops of a resize (design §4), in the order the executor's DAG allows."""

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


@runtime_checkable
class RecoveryOps(DeviceSlot, Protocol):
    """Checkpoints (`checkpoint`) and a new world after a device death (`recovery`). A dead
    device's calls raise (a dead Ray actor's do); `recovery` then asks the backend whether
    the process is gone."""

    async def save_checkpoint(self, path: str) -> dict[str, float]:
        """Collective over the training group: write this rank's shards of model + optimizer
        state under the directory `path`. Returns {"checkpoint_bytes", ...}."""
        ...

    async def load_checkpoint(self, path: str, optimizer_step: int) -> dict[str, float]:
        """Collective over the training group: load a checkpoint written by a group of any
        size into this group's sharding; the optimizer resumes at `optimizer_step`."""
        ...

    async def rebuild_world(self, store: int | str, ranks: dict[int, int],
                            train_members: tuple[int, ...], optimizer_step: int,
                            keep_train_state: bool) -> None:
        """Collective over the survivors: a fresh world group at `store`, ranks renumbered
        (`ranks`: device index -> rank), a new training group `train_members`; training
        ranks keep their shards if `keep_train_state` (else they start from version 0 and
        the caller loads the recovery point)."""
        ...


@runtime_checkable
class Device(DeviceSlot, Protocol):
    """Every op of `RolloutOps`, `TrainOps`, `ResizeOps` and `RecoveryOps` (documented
    there): what the orchestrator holds. Kept equal to their union by
    tests/unit/test_protocols.py."""

    # RolloutOps
    async def load_weights(self, version: int, weights: WeightHandle) -> None: ...

    async def submit(self, requests: list[RequestSpec | InflightRequest]) -> None: ...

    async def run_rollout(self, max_s: float, until_empty: bool = False
                          ) -> list[Completion]: ...

    async def export_inflight(self) -> list[InflightRequest]: ...

    # TrainOps
    async def join_train_group(self, members: tuple[int, ...], generation: int) -> None: ...

    async def train_step(self, step: int, micro_batches: list[list[TrainSample] | None],
                         global_num_tokens: int) -> dict[str, float]: ...

    async def train_accumulate(self, step: int,
                               micro_batches: list[tuple[int, list[TrainSample]]]) -> None: ...

    async def train_finish(self, step: int, num_micro_batches: int,
                           global_num_tokens: int) -> dict[str, float]: ...

    async def publish_weights(self, version: int) -> WeightHandle | None: ...

    async def param_checksum(self) -> tuple[float, str]: ...

    # ResizeOps
    async def release_kv(self) -> None: ...

    async def release_rollout_weights(self) -> None: ...

    async def alloc_kv(self) -> None: ...

    async def join_group(self, members: tuple[int, ...]) -> bool: ...

    async def reshard(self, old_members: tuple[int, ...], new_members: tuple[int, ...],
                      generation: int, optimizer_step: int, staging_bytes: int
                      ) -> dict[str, float]: ...

    async def commit_train_group(self, new_members: tuple[int, ...]) -> None: ...

    async def abort_reshard(self) -> None: ...

    async def drop_trainer(self) -> None: ...

    # RecoveryOps
    async def save_checkpoint(self, path: str) -> dict[str, float]: ...

    async def load_checkpoint(self, path: str, optimizer_step: int) -> dict[str, float]: ...

    async def rebuild_world(self, store: int | str, ranks: dict[int, int],
                            train_members: tuple[int, ...], optimizer_step: int,
                            keep_train_state: bool) -> None: ...


@runtime_checkable
class ProcessTable(Protocol):
    """The backend's view of its device processes, what fault injection and recovery ask
    besides the devices (`DevicePool` for Ray, `sim.faults.SimProcesses` for the twin)."""

    def kill(self, index: int) -> None:
        """Kill device `index`'s process now (fault injection)."""
        ...

    def is_alive(self, index: int) -> bool:
        """Whether device `index`'s process still runs (recovery: a failed call on a live
        device is a bug, not a fault)."""
        ...

    def new_store(self) -> int | str:
        """A fresh rendezvous for `RecoveryOps.rebuild_world`."""
        ...

    def cause(self, index: int) -> str | None:
        """Why dead device `index` died, where the backend knows more than "gone" (the Ray
        pool's watchdog killed it as hung); else None."""
        ...


ROLE_PROTOCOLS = (RolloutOps, TrainOps, ResizeOps, RecoveryOps)
"""The device seam split by role; `Device` is their union."""
