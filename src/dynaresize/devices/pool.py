"""DevicePool: one long-lived DeviceActor per device on the Ray cluster.

It places the actors (a placement group, `devices.placement`), forms the world process group
once (`devices.world`), hands out `RayDevice` handles for each run, tells live devices from
dead ones, kills them for fault injection and for hangs (`devices.watchdog`), and replaces
the dead after a run (`repair`). Starting or joining the cluster: `devices.cluster`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

from dynaresize.core.types import Role
from dynaresize.devices.actor import DeviceActor
from dynaresize.devices.cluster import NodeInfo, dead_nodes, this_node
from dynaresize.devices.network import base_env, is_loopback
from dynaresize.devices.placement import device_bundle, place_devices
from dynaresize.devices.procfs import cpu_ticks, process_alive, start_ticks
from dynaresize.devices.ray_device import CONTROL_GROUP, ROLLOUT_GROUP, RayDevice
from dynaresize.devices.settings import DeviceSettings
from dynaresize.devices.watchdog import Watchdog

__all__ = ["DevicePool"]

PING_TIMEOUT_S = 10.0
"""A device on another machine that does not answer a ping this long is taken for lost."""


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
        self.hung: dict[int, float] = {}
        """Device index -> seconds it had answered no ping when the watchdog killed it."""
        self._gone: set[int] = set()
        """Devices found dead by themselves while watched (a ping failed): nothing to kill."""
        self.frozen: set[int] = set()
        """Devices frozen by `hang` (fault injection); `repair` ends those still there."""
        self._started: dict[int, int] = {}
        """Device index -> its process's start time (clock ticks) on this machine: a pid
        another process took over is not the device's (`_local_alive`)."""
        self._cpu_ticks: dict[int, int] = {}
        """Device index -> its process's CPU time at the watchdog's last round (`_working`)."""
        self._watchdog: Watchdog | None = None
        self.actors = [self._start(i) for i in range(num_devices)]
        try:
            self.hosts: list[NodeInfo] = self._call_all("placement", range(num_devices))
            self._remember_starts(range(num_devices))
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

    def _remember_starts(self, indices: Iterable[int]) -> None:
        for i in indices:
            if self._on_this_machine(i):
                self._started[i] = start_ticks(self.hosts[i].pid)

    def _local_alive(self, index: int) -> bool:
        """This machine's device `index`: its process (the same one, not a reused pid) and
        its node's raylet are there and not zombies."""
        host = self.hosts[index]
        return process_alive(host.pid, self._started.get(index)) and \
            process_alive(host.parent_pid)

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

    def hang(self, index: int) -> None:
        """Freeze device `index`'s process (fault injection): SIGSTOP on this machine, the
        actor stopping itself on another. It neither answers nor dies: only the watchdog
        (`watch`) ends it."""
        self.frozen.add(index)
        if self._on_this_machine(index):
            os.kill(self.pids[index], signal.SIGSTOP)
        else:
            self._control(index, "freeze").remote()

    def cause(self, index: int) -> str | None:
        """Why device `index` is dead, where the pool knows more than "the process is gone"
        (the watchdog killed it as hung); None otherwise."""
        if index in self.hung:
            return f"hung: answered no ping for {self.hung[index]:.1f} s, killed"
        return None

    # ------------------------------------------------------------------ hangs
    def watch(self, hang_timeout_s: float) -> None:
        """Kill any device that answers no ping for `hang_timeout_s` (`devices.watchdog`),
        from now on; 0 stops watching. A run watches with its `faults.hang_timeout_s`."""
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        if hang_timeout_s > 0:
            self._cpu_ticks = {}
            self._watchdog = Watchdog(hang_timeout_s, self._ping, _poll, self._watched,
                                      self._kill_hung, dead=self._gone.add,
                                      working=self._working)

    def _working(self, index: int) -> bool | None:
        """Whether device `index`'s process (this machine) used CPU since the last call."""
        if not self._on_this_machine(index):
            return None
        ticks, self._cpu_ticks[index] = self._cpu_ticks.get(index), \
            cpu_ticks(self.hosts[index].pid)
        return ticks is not None and self._cpu_ticks[index] > ticks

    def _ping(self, index: int) -> Any:
        return self._control(index, "ready").remote()

    def _watched(self) -> list[int]:
        return [i for i in range(len(self.actors)) if i not in self.killed
                and i not in self._gone]

    def _kill_hung(self, index: int, silent_s: float) -> None:
        """The watchdog's verdict. A device on this machine whose process is gone died by
        itself (recovery's; no pid to kill); one on another machine cannot be asked (it does
        not answer): `ray.kill` ends it whatever it is."""
        if index in self._gone or (self._on_this_machine(index) and
                                   not self._local_alive(index)):
            self._gone.add(index)
            return
        self.hung[index] = silent_s
        print(f"dynaresize: device {index} answered no ping for {silent_s:.1f} s "
              f"(faults.hang_timeout_s): killed as hung", file=sys.stderr)
        try:
            self.kill(index)
        except ProcessLookupError:  # it died meanwhile
            self._gone.add(index)

    def is_alive(self, index: int) -> bool:
        """Whether device `index`'s process still runs: not killed by us, its node not lost,
        and (on this machine) neither its process nor its node's raylet gone or a zombie, or
        (on another machine) answering a ping. A killed process can linger in /proc for a
        moment after Ray reports it dead: the `killed` set makes injected kills unambiguous."""
        if index in self.killed:
            return False
        if self._on_this_machine(index):
            return self._local_alive(index)
        if self.hosts[index].node_id in dead_nodes():
            return False
        import ray

        try:
            ray.get(self._ping(index), timeout=PING_TIMEOUT_S)
        except Exception:  # RayActorError, GetTimeoutError: gone or unreachable
            return False
        return True

    def repair(self) -> list[int]:
        """Between runs: replace dead actors (in their own bundles) and those a fault injection
        froze, and re-form one world over all devices (a pool shared by several runs is whole
        again after a fault run). Stops the hang watchdog. Returns the replaced indices."""
        self.watch(0)
        for i in sorted(self.frozen - self.killed):
            with contextlib.suppress(ProcessLookupError):
                self.kill(i)
        dead = [i for i in range(self.num_devices) if not self.is_alive(i)]
        if not dead:
            return []
        for i in dead:
            self.actors[i] = self._start(i)
        for i, host in zip(dead, self._call_all("placement", dead), strict=True):
            self.hosts[i] = host
        self._remember_starts(dead)
        self.killed.clear()
        self._gone.clear()
        self.hung.clear()
        self.frozen.clear()
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

        self.watch(0)
        local = [h.pid for i, h in enumerate(getattr(self, "hosts", []))
                 if self._on_this_machine(i)] if wait_s > 0 else []
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
        self.placement.remove()
        deadline = time.monotonic() + wait_s
        while any(process_alive(pid) for pid in local) and time.monotonic() < deadline:
            time.sleep(0.05)


def _poll(refs: list[Any]) -> dict[Any, bool]:
    """The pings among `refs` answered by now: True for an answer, False for an error."""
    import ray

    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    done: dict[Any, bool] = {}
    for ref in ready:
        try:
            ray.get(ref, timeout=0)
            done[ref] = True
        except Exception:  # the actor died: recovery's to find, not the watchdog's
            done[ref] = False
    return done
