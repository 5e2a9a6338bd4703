"""`DevicePool`'s side of a hang verdict (`_kill_hung`), without Ray: a frozen device on
another machine is killed (it cannot be asked), a local device whose pid now belongs to
another process is not (it died by itself), and `is_alive` tells the two processes apart by
their start time."""

from __future__ import annotations

import subprocess
from typing import Any

from dynaresize.devices.cluster import NodeInfo
from dynaresize.devices.pool import DevicePool
from dynaresize.devices.procfs import start_ticks


def bare_pool(hosts: list[NodeInfo], driver_ip: str) -> Any:
    """A DevicePool's bookkeeping without actors (no Ray); `kill` records instead."""
    pool = DevicePool.__new__(DevicePool)
    pool.hosts, pool.actors = hosts, [object() for _ in hosts]
    pool.num_devices = len(hosts)
    pool._driver = NodeInfo("driver", driver_ip, 1, 1)
    pool.killed, pool.hung, pool._gone, pool.frozen = set(), {}, set(), set()
    pool._started, pool._watchdog, pool._cpu_ticks = {}, None, {}
    pool.kills = []
    pool.kill = lambda index: (pool.killed.add(index), pool.kills.append(index))
    return pool


def test_a_frozen_remote_device_is_killed() -> None:
    pool = bare_pool([NodeInfo("n1", "10.0.0.7", 4242, 4241)], driver_ip="10.0.0.1")
    pool._kill_hung(0, 31.0)
    assert pool.kills == [0] and pool.cause(0).startswith("hung: answered no ping for 31.0 s")


def test_a_reused_pid_is_not_the_device() -> None:
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        host = NodeInfo("n0", "127.0.0.1", stranger.pid, stranger.pid)
        pool = bare_pool([host], driver_ip="127.0.0.1")
        pool._started[0] = start_ticks(stranger.pid)
        assert pool.is_alive(0)                  # the device's own process
        pool._started[0] -= 1                    # ... had it started at another time
        assert not pool.is_alive(0)
        pool._kill_hung(0, 31.0)
        assert pool.kills == [] and pool._gone == {0} and pool.cause(0) is None
        assert stranger.poll() is None           # the stranger lives
    finally:
        stranger.kill()
        stranger.wait()


def test_repair_ends_a_device_an_injection_froze() -> None:
    """A run that ends (fails, or stops) before the watchdog killed a device it froze leaves a
    stopped process that counts as alive: the shared pool's repair replaces it anyway."""
    pool = bare_pool([NodeInfo("n1", "10.0.0.7", 10 + i, 9) for i in range(3)],
                     driver_ip="10.0.0.1")
    pool.frozen.add(1)
    pool.is_alive = lambda index: index not in pool.killed
    pool._start = lambda index: f"new actor {index}"
    pool._call_all = lambda name, indices: [pool.hosts[i] for i in indices]
    pool._form_world = lambda: None
    assert pool.repair() == [1] and pool.kills == [1]
    assert pool.actors[1] == "new actor 1" and not pool.frozen and not pool.killed


def test_a_silent_device_burning_cpu_is_working_a_stopped_one_is_not() -> None:
    """A long native call holding the GIL delays the pings but burns CPU: the watchdog counts
    that as an answer (`Watchdog(working=...)`); a frozen (stopped) process burns none."""
    import signal
    import sys
    import time

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        pool = bare_pool([NodeInfo("n0", "127.0.0.1", busy.pid, busy.pid)], "127.0.0.1")
        assert pool._working(0) is False                  # first sight: nothing to compare
        time.sleep(0.3)
        assert pool._working(0) is True
        busy.send_signal(signal.SIGSTOP)
        time.sleep(0.1)
        pool._working(0)
        time.sleep(0.3)
        assert pool._working(0) is False
        remote = bare_pool([NodeInfo("n1", "10.0.0.7", 1, 1)], "10.0.0.1")
        assert remote._working(0) is None                 # another machine: pings only
    finally:
        busy.kill()
        busy.wait()
