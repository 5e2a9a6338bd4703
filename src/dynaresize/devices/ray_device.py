"""RayDevice: the driver-side handle of one DeviceActor, implementing the Device protocol.

Also `DevicePool`: starts (or joins) a Ray cluster on loopback, starts one long-lived actor per
device, forms the world process group once, and hands out RayDevice handles for each run.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from typing import Any

from dynaresize.devices.actor import LOOPBACK, DeviceActor, loopback_env
from dynaresize.types import Completion, InflightRequest, RequestSpec, Role, TrainSample


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


ROLLOUT_GROUP = "rollout"
"""Actor concurrency group of the rollout-side methods (one thread; the default group has
one thread too)."""


class RayDevice:
    """The `Device` protocol (rollout, train, resize and recovery ops) over a DeviceActor
    handle; a call on a dead actor raises `ActorDiedError`."""

    def __init__(self, index: int, actor: Any, cfg_dict: dict[str, Any], role: Role) -> None:
        self.index = index
        self.actor = actor
        self.role = role
        self._cfg_dict = cfg_dict
        self._members: tuple[int, ...] = ()

    def _rollout_call(self, name: str) -> Any:
        """Rollout-side methods run in the actor's `rollout` concurrency group, so a device
        leaving training can load weights and start serving while its shards still stream
        out to the remaining ranks (`reshard`, default group)."""
        return getattr(self.actor, name).options(concurrency_group=ROLLOUT_GROUP).remote

    async def start(self) -> None:
        await self.actor.configure.remote(self._cfg_dict, self.role.value)

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

    async def rebuild_world(self, store: int | str, ranks: dict[int, int],
                            train_members: tuple[int, ...], optimizer_step: int,
                            keep_train_state: bool) -> None:
        members = tuple(sorted(train_members))
        self._members = members if self.index in members else ()
        await self.actor.rebuild_world.remote(store, ranks, members, optimizer_step,
                                              keep_train_state)

    async def stop(self) -> None:
        return None


class DevicePool:
    """Long-lived device actors sharing one world process group."""

    def __init__(self, num_devices: int, device_type: str = "cpu", threads: int = 1,
                 pg_timeout_s: float = 60.0) -> None:
        import ray

        self.num_devices = num_devices
        self.device_type = device_type
        self._store_dir = tempfile.mkdtemp(prefix="dynaresize-store-")
        self._num_stores = 0
        port = self.new_store()
        self._remote_cls = ray.remote(concurrency_groups={ROLLOUT_GROUP: 1})(DeviceActor).options(
            num_cpus=0 if device_type == "cpu" else 1,
            num_gpus=1 if device_type == "cuda" else 0,
            runtime_env={"env_vars": loopback_env()}, max_restarts=0)
        self._args = (device_type, threads, pg_timeout_s)
        self.actors = [self._remote_cls.remote(i, num_devices, port, *self._args)
                       for i in range(num_devices)]
        self.pids: list[int] = ray.get([a.ready.remote() for a in self.actors])
        self.killed: set[int] = set()

    def new_store(self) -> str:
        """A fresh rendezvous for a world group (a file: no listener, see actor.init_method)."""
        self._num_stores += 1
        return f"file://{self._store_dir}/world-{self._num_stores}"

    def kill(self, index: int) -> None:
        """Kill device `index`'s process for real (SIGKILL: no cleanup, like a lost GPU host)."""
        self.killed.add(index)
        os.kill(self.pids[index], signal.SIGKILL)

    def is_alive(self, index: int) -> bool:
        """Whether device `index`'s process still runs (not killed by us, not gone, not a
        zombie). A killed process can linger in /proc for a moment after Ray reports it dead:
        the `killed` set makes injected kills unambiguous."""
        if index in self.killed:
            return False
        try:
            with open(f"/proc/{self.pids[index]}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (OSError, IndexError):
            return False

    def repair(self) -> list[int]:
        """Replace dead actors and re-form one world over all devices (a pool shared by
        several runs is whole again after a fault run). Returns the replaced indices."""
        import ray

        dead = [i for i in range(self.num_devices) if not self.is_alive(i)]
        if not dead:
            return []
        port = self.new_store()
        identity = {i: i for i in range(self.num_devices)}
        for i in dead:
            self.actors[i] = self._remote_cls.remote(i, self.num_devices, port, *self._args)
        calls = [a.ready.remote() if i in dead else a.rebuild_world.remote(port, identity, (), 0,
                                                                           False)
                 for i, a in enumerate(self.actors)]
        ray.get(calls)
        self.pids = ray.get([a.ready.remote() for a in self.actors])
        self.killed.clear()
        return dead

    def devices(self, cfg_dict: dict[str, Any], roles: tuple[Role, ...]) -> list[RayDevice]:
        assert len(roles) == self.num_devices
        return [RayDevice(i, a, cfg_dict, roles[i]) for i, a in enumerate(self.actors)]

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
        shutil.rmtree(self._store_dir, ignore_errors=True)

