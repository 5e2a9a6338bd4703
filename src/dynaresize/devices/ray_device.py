"""RayDevice: the driver-side handle of one DeviceActor, implementing the Device protocol.

Also `DevicePool`: places one long-lived actor per device on the Ray cluster (a placement
group, `devices.placement`), forms the world process group once (`devices.world`), and hands
out RayDevice handles for each run. Starting or joining the cluster: `devices.cluster`.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from dynaresize.core.types import Completion, InflightRequest, RequestSpec, Role, TrainSample
from dynaresize.devices.actor import DeviceActor
from dynaresize.devices.cluster import NodeInfo, dead_nodes, ensure_ray, this_node
from dynaresize.devices.network import base_env, is_loopback
from dynaresize.devices.placement import device_bundle, place_devices
from dynaresize.devices.settings import DeviceSettings

__all__ = ["DevicePool", "RayDevice", "ensure_ray"]

ROLLOUT_GROUP = "rollout"
"""Actor concurrency group of the rollout-side methods (one thread; the default group has
one thread too)."""
CONTROL_GROUP = "control"
"""Actor concurrency group of the pool's own calls (placement, store, liveness pings): they
answer while the device is busy in a collective."""
PING_TIMEOUT_S = 10.0
"""A device on another machine that does not answer a ping this long is taken for lost."""


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


class DevicePool:
    """Long-lived device actors sharing one world process group."""

    def __init__(self, num_devices: int, device_type: str = "cpu", threads: int = 1,
                 pg_timeout_s: float = 60.0, strategy: str = "PACK",
                 placement_timeout_s: float = 120.0, gpus_per_device: float = 1.0) -> None:
        import ray

        self.num_devices = num_devices
        self.device_type = device_type
        bundle = device_bundle(device_type, threads, gpus_per_device)
        self.placement = place_devices(num_devices, bundle, strategy, placement_timeout_s)
        self._placement_timeout_s = placement_timeout_s
        self._remote_cls = ray.remote(
            concurrency_groups={ROLLOUT_GROUP: 1, CONTROL_GROUP: 1})(DeviceActor)
        self._options = {"num_cpus": bundle.get("CPU", 0.0), "num_gpus": bundle.get("GPU", 0.0),
                         "runtime_env": {"env_vars": base_env()}, "max_restarts": 0}
        self._args = (device_type, threads, pg_timeout_s)
        self._driver = this_node()
        self.killed: set[int] = set()
        self.actors = [self._start(i) for i in range(num_devices)]
        try:
            self.hosts: list[NodeInfo] = self._call_all("placement", range(num_devices))
            self._form_world()
        except BaseException:
            self.shutdown()
            raise

    # ------------------------------------------------------------------ placement
    def _start(self, index: int) -> Any:
        return self._remote_cls.options(**self._options, scheduling_strategy=(
            self.placement.scheduling(index))).remote(index, self.num_devices, None, *self._args)

    def _control(self, index: int, name: str) -> Any:
        return getattr(self.actors[index], name).options(concurrency_group=CONTROL_GROUP)

    def _call_all(self, name: str, indices: Any) -> list[Any]:
        import ray

        return ray.get([self._control(i, name).remote() for i in indices],
                       timeout=self._placement_timeout_s)

    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self.hosts]

    @property
    def node_of(self) -> dict[int, str]:
        """Device index → id of the Ray node hosting it."""
        return {i: h.node_id for i, h in enumerate(self.hosts)}

    @property
    def num_nodes(self) -> int:
        """Distinct Ray nodes hosting the devices."""
        return len({h.node_id for h in self.hosts})

    def _on_this_machine(self, index: int) -> bool:
        ip = self.hosts[index].node_ip
        return is_loopback(ip) or ip == self._driver.node_ip

    # ------------------------------------------------------------------ world
    def new_store(self) -> str:
        """A fresh rendezvous for a world group: a store address on the first live device's
        node, served by that device (see `devices.world`)."""
        import ray

        host = next(i for i in range(self.num_devices) if self.is_alive(i))
        return ray.get(self._control(host, "open_store").remote(),
                       timeout=self._placement_timeout_s)

    def _form_world(self) -> None:
        import ray

        store = self.new_store()
        identity = {i: i for i in range(self.num_devices)}
        ray.get([a.rebuild_world.remote(store, identity, (), 0, False) for a in self.actors])

    # ------------------------------------------------------------------ faults
    def kill(self, index: int) -> None:
        """Kill device `index`'s process for real, like a lost GPU host: SIGKILL (no cleanup)
        on this machine, `ray.kill` on another."""
        import ray

        self.killed.add(index)
        if self._on_this_machine(index):
            os.kill(self.pids[index], signal.SIGKILL)
        else:
            ray.kill(self.actors[index], no_restart=True)

    def is_alive(self, index: int) -> bool:
        """Whether device `index`'s process still runs: not killed by us, its node not lost,
        and (on this machine) neither its process nor its node's raylet gone or a zombie, or
        (on another machine) answering a ping. A killed process can linger in /proc for a
        moment after Ray reports it dead: the `killed` set makes injected kills unambiguous."""
        if index in self.killed:
            return False
        if self._on_this_machine(index):
            host = self.hosts[index]
            return _process_alive(host.pid) and _process_alive(host.parent_pid)
        if self.hosts[index].node_id in dead_nodes():
            return False
        import ray

        try:
            ray.get(self._control(index, "ready").remote(), timeout=PING_TIMEOUT_S)
        except Exception:  # RayActorError, GetTimeoutError: gone or unreachable
            return False
        return True

    def repair(self) -> list[int]:
        """Replace dead actors (in their own bundles) and re-form one world over all devices
        (a pool shared by several runs is whole again after a fault run). Returns the replaced
        indices."""
        dead = [i for i in range(self.num_devices) if not self.is_alive(i)]
        if not dead:
            return []
        for i in dead:
            self.actors[i] = self._start(i)
        for i, host in zip(dead, self._call_all("placement", dead), strict=True):
            self.hosts[i] = host
        self.killed.clear()
        self._form_world()
        return dead

    def devices(self, settings: DeviceSettings, roles: tuple[Role, ...]) -> list[RayDevice]:
        """The devices of a run; each receives its part of the config (`settings`)."""
        assert len(roles) == self.num_devices
        return [RayDevice(i, a, settings, roles[i]) for i, a in enumerate(self.actors)]

    def shutdown(self, wait_s: float = 0.0) -> None:
        """End every device process; `wait_s`: wait up to that long for those on this
        machine to be gone (their memory free)."""
        import ray

        local = [h.pid for i, h in enumerate(getattr(self, "hosts", []))
                 if self._on_this_machine(i)] if wait_s > 0 else []
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
        self.placement.remove()
        deadline = time.monotonic() + wait_s
        while any(_process_alive(pid) for pid in local) and time.monotonic() < deadline:
            time.sleep(0.05)


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
