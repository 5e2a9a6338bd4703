"""RayDevice: the driver-side handle of one DeviceActor, implementing the Device protocol.

Also `DevicePool`: starts (or joins) a Ray cluster on loopback, starts one long-lived actor per
device, forms the world process group once, and hands out RayDevice handles for each run.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from dynaresize.devices.actor import LOOPBACK, DeviceActor, loopback_env
from dynaresize.types import Completion, InflightRequest, RequestSpec, Role, TrainSample


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect to `address`, or start a local cluster on loopback. True if we started it."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, _node_ip_address=LOOPBACK, logging_level="warning",
                 log_to_driver=False)
        return False
    ray.init(_node_ip_address=LOOPBACK, include_dashboard=False, num_cpus=num_cpus,
             logging_level="warning", log_to_driver=False,
             runtime_env={"env_vars": loopback_env()})
    return True


class RayDevice:
    """Device protocol over a DeviceActor handle."""

    def __init__(self, index: int, actor: Any, cfg_dict: dict[str, Any], role: Role) -> None:
        self.index = index
        self.actor = actor
        self.role = role
        self._cfg_dict = cfg_dict
        self._members: tuple[int, ...] = ()

    async def start(self) -> None:
        await self.actor.configure.remote(self._cfg_dict, self.role.value)

    async def load_weights(self, version: int, weights: Any) -> None:
        await self.actor.load_weights.remote(version, weights)

    async def submit(self, requests: list[RequestSpec | InflightRequest]) -> None:
        await self.actor.submit.remote(requests)

    async def run_rollout(self, max_s: float) -> list[Completion]:
        return await self.actor.run_rollout.remote(max_s)

    async def export_inflight(self) -> list[InflightRequest]:
        return await self.actor.export_inflight.remote()

    async def join_train_group(self, members: tuple[int, ...], generation: int) -> None:
        self._members = tuple(sorted(members))
        await self.actor.join_train_group.remote(self._members, generation)

    async def train_step(self, step: int, micro_batches: list[list[TrainSample] | None],
                         global_num_tokens: int) -> dict[str, float]:
        return await self.actor.train_step.remote(step, micro_batches, global_num_tokens)

    async def publish_weights(self, version: int) -> Any:
        done_ref, state_ref = self.actor.publish_weights.options(num_returns=2).remote(version)
        await done_ref
        return state_ref if self._members and self._members[0] == self.index else None

    async def param_checksum(self) -> tuple[float, str]:
        return tuple(await self.actor.param_checksum.remote())  # type: ignore[return-value]

    async def release_kv(self) -> None:
        await self.actor.release_kv.remote()

    async def release_rollout_weights(self) -> None:
        await self.actor.release_rollout_weights.remote()

    async def alloc_kv(self) -> None:
        await self.actor.alloc_kv.remote()

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

    async def stop(self) -> None:
        return None


class DevicePool:
    """Long-lived device actors sharing one world process group."""

    def __init__(self, num_devices: int, device_type: str = "cpu", threads: int = 1) -> None:
        import ray

        self.num_devices = num_devices
        self.device_type = device_type
        port = free_port()
        remote_cls = ray.remote(DeviceActor).options(
            num_cpus=0 if device_type == "cpu" else 1,
            num_gpus=1 if device_type == "cuda" else 0,
            runtime_env={"env_vars": loopback_env()}, max_restarts=0)
        self.actors = [remote_cls.remote(i, num_devices, port, device_type, threads)
                       for i in range(num_devices)]
        self.pids: list[int] = ray.get([a.ready.remote() for a in self.actors])

    def devices(self, cfg_dict: dict[str, Any], roles: tuple[Role, ...]) -> list[RayDevice]:
        assert len(roles) == self.num_devices
        return [RayDevice(i, a, cfg_dict, roles[i]) for i, a in enumerate(self.actors)]

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []


async def gather_stats(devices: list[RayDevice]) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(d.stats() for d in devices)))
