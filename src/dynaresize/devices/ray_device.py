"""RayDevice: the driver-side handle of one DeviceActor, implementing the Device protocol.

The actors behind the handles are `devices.pool.DevicePool`'s; starting or joining the
cluster: `devices.cluster`.
"""

from __future__ import annotations

from typing import Any

from dynaresize.core.types import Completion, InflightRequest, RequestSpec, Role, TrainSample
from dynaresize.devices.cluster import ensure_ray, ray_session
from dynaresize.devices.settings import DeviceSettings

__all__ = ["CONTROL_GROUP", "ROLLOUT_GROUP", "RayDevice", "ensure_ray", "ray_session"]

ROLLOUT_GROUP = "rollout"
"""Actor concurrency group of the rollout-side methods (one thread; the default group has
one thread too)."""
CONTROL_GROUP = "control"
"""Actor concurrency group of the pool's own calls (placement, store, liveness pings): they
answer while the device is busy in a collective."""
class RayDevice:
    """The `Device` protocol (rollout, train, resize and recovery ops) over a DeviceActor
    handle; a call on a dead actor raises `ActorDiedError`."""

    def __init__(self, index: int, actor: Any, settings: DeviceSettings, role: Role) -> None:
        self.index = index
        self.actor = actor
        self.role = role
        self._settings = settings
        self._members: tuple[int, ...] = ()

    def _rollout_call(self, name: str) -> Any:
        """Rollout-side methods run in the actor's `rollout` concurrency group, so a device
        leaving training can load weights and start serving while its shards still stream
        out to the remaining ranks (`reshard`, default group)."""
        return getattr(self.actor, name).options(concurrency_group=ROLLOUT_GROUP).remote

    async def start(self) -> None:
        await self.actor.configure.remote(self._settings, self.role.value)

    async def load_weights(self, version: int, weights: Any) -> None:
        await self._rollout_call("load_weights")(version, weights)

    async def submit(self, requests: list[RequestSpec | InflightRequest]) -> None:
        await self._rollout_call("submit")(requests)

    async def run_rollout(self, max_s: float, until_empty: bool = False) -> list[Completion]:
        return await self._rollout_call("run_rollout")(max_s, until_empty)

    async def export_inflight(self) -> list[InflightRequest]:
        return await self._rollout_call("export_inflight")()

    async def join_train_group(self, members: tuple[int, ...], generation: int) -> None:
        self._members = tuple(sorted(members))
        await self.actor.join_train_group.remote(self._members, generation)

    async def train_step(self, step: int, micro_batches: list[list[TrainSample] | None],
                         global_num_tokens: int) -> dict[str, float]:
        return await self.actor.train_step.remote(step, micro_batches, global_num_tokens)

    async def train_accumulate(self, step: int,
                               micro_batches: list[tuple[int, list[TrainSample]]]) -> None:
        await self.actor.train_accumulate.remote(step, micro_batches)

    async def train_finish(self, step: int, num_micro_batches: int,
                           global_num_tokens: int) -> dict[str, float]:
        return await self.actor.train_finish.remote(step, num_micro_batches, global_num_tokens)

    async def publish_weights(self, version: int) -> Any:
        done_ref, state_ref = self.actor.publish_weights.options(num_returns=2).remote(version)
        await done_ref
        return state_ref if self._members and self._members[0] == self.index else None

    async def save_checkpoint(self, path: str) -> dict[str, float]:
        return await self.actor.save_checkpoint.remote(path)

    async def load_checkpoint(self, path: str, optimizer_step: int) -> dict[str, float]:
        return await self.actor.load_checkpoint.remote(path, optimizer_step)

    async def param_checksum(self) -> tuple[float, str]:
        return tuple(await self.actor.param_checksum.remote())  # type: ignore[return-value]

    async def release_kv(self) -> None:
        await self._rollout_call("release_kv")()

    async def release_rollout_weights(self) -> None:
        await self._rollout_call("release_rollout_weights")()

    async def alloc_kv(self) -> None:
        await self._rollout_call("alloc_kv")()

    async def join_group(self, members: tuple[int, ...]) -> bool:
        return await self.actor.join_group.remote(tuple(sorted(members)))

    async def reshard(self, old_members: tuple[int, ...], new_members: tuple[int, ...],
                      generation: int, optimizer_step: int, staging_bytes: int
                      ) -> dict[str, float]:
        return await self.actor.reshard.remote(old_members, new_members, generation,
                                               optimizer_step, staging_bytes)

    async def commit_train_group(self, new_members: tuple[int, ...]) -> None:
        self._members = tuple(sorted(new_members)) if self.index in new_members else ()
        await self.actor.commit_train_group.remote(tuple(new_members))

    async def abort_reshard(self) -> None:
        await self.actor.abort_reshard.remote()

    async def drop_trainer(self) -> None:
        await self.actor.drop_trainer.remote()

    async def stats(self) -> dict[str, Any]:
        return await self.actor.stats.remote()

    async def rebuild_world(self, store: str, ranks: dict[int, int],
                            train_members: tuple[int, ...], optimizer_step: int,
                            keep_train_state: bool) -> None:
        members = tuple(sorted(train_members))
        self._members = members if self.index in members else ()
        await self.actor.rebuild_world.remote(store, ranks, members, optimizer_step,
                                              keep_train_state)

    async def stop(self) -> None:
        return None
