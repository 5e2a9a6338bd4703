"""The hang watchdog's decisions (`devices.watchdog`), on a fake clock and fake pings: who is
killed, when, and who is not (a device answering late, one that died by itself, a stall of
the watching process itself)."""

from __future__ import annotations

from typing import Any

from dynaresize.devices.watchdog import HangWatch, Watchdog, ping_interval_s


class FakeDevices:
    """Devices that answer a ping at the next round unless frozen; `dead` ones answer with
    an error."""

    def __init__(self, num: int) -> None:
        self.num = num
        self.frozen: set[int] = set()
        self.dead: set[int] = set()
        self.killed: dict[int, float] = {}
        self.sent: list[int] = []
        self.now_s = 0.0

    def ping(self, index: int) -> Any:
        self.sent.append(index)
        return ("ping", index, len(self.sent))

    def poll(self, refs: list[Any]) -> dict[Any, bool]:
        return {r: r[1] not in self.dead for r in refs if r[1] not in self.frozen}

    def watched(self) -> list[int]:
        return [i for i in range(self.num) if i not in self.killed]

    def kill(self, index: int, silent_s: float) -> None:
        self.killed[index] = silent_s


def watchdog(devices: FakeDevices, timeout_s: float) -> Watchdog:
    return Watchdog(timeout_s, devices.ping, devices.poll, devices.watched, devices.kill,
                    now=lambda: devices.now_s, start=False)


def run_rounds(dog: Watchdog, devices: FakeDevices, until_s: float, step_s: float) -> None:
    while devices.now_s < until_s:
        devices.now_s = round(devices.now_s + step_s, 6)
        dog.tick()


def test_a_frozen_device_is_killed_after_the_timeout_and_only_it() -> None:
    devices = FakeDevices(4)
    dog = watchdog(devices, timeout_s=3.0)
    run_rounds(dog, devices, 2.0, 0.3)
    devices.frozen.add(2)
    frozen_at_s = devices.now_s
    run_rounds(dog, devices, frozen_at_s + 2.9, 0.3)
    assert devices.killed == {}                       # not yet: silent < 3 s
    run_rounds(dog, devices, frozen_at_s + 4.0, 0.3)
    assert list(devices.killed) == [2]
    assert 3.0 < devices.killed[2] <= 3.6             # reported silence ~ the timeout
    run_rounds(dog, devices, frozen_at_s + 10.0, 0.3)
    assert list(devices.killed) == [2]                # once; the others keep answering


def test_one_ping_in_flight_per_device() -> None:
    devices = FakeDevices(2)
    devices.frozen.add(1)
    dog = watchdog(devices, timeout_s=30.0)
    run_rounds(dog, devices, 10.0, 1.0)
    assert devices.sent.count(1) == 1                 # no pile of unanswered pings
    assert devices.sent.count(0) == 10


def test_a_device_that_died_by_itself_is_not_the_watchdogs() -> None:
    """An error answer (the actor died) is no answer; the pool's `kill` callback decides
    what to do with a dead device (it skips it): the watchdog only reports silence."""
    devices = FakeDevices(3)
    dog = watchdog(devices, timeout_s=2.0)
    devices.dead.add(0)
    run_rounds(dog, devices, 5.0, 0.2)
    assert list(devices.killed) == [0]


def test_a_stall_of_the_watching_process_kills_nobody() -> None:
    """A round that comes far too late (the driver was suspended): every device's answer may
    be waiting unread, so silence is counted from now, not from the last round."""
    devices = FakeDevices(3)
    dog = watchdog(devices, timeout_s=3.0)
    run_rounds(dog, devices, 1.0, 0.3)
    devices.now_s += 60.0
    assert dog.tick() == []
    run_rounds(dog, devices, devices.now_s + 10.0, 0.3)
    assert devices.killed == {}


def test_a_failed_ping_is_a_death_not_a_hang() -> None:
    """A ping answered with an error (the actor died) goes to `dead`: the caller stops
    watching that device, so it is never "killed as hung" (its pid may be another's)."""
    devices = FakeDevices(3)
    gone: list[int] = []

    def watched() -> list[int]:
        return [i for i in devices.watched() if i not in gone]

    dog = Watchdog(2.0, devices.ping, devices.poll, watched, devices.kill,
                   now=lambda: devices.now_s, start=False, dead=gone.append)
    devices.dead.add(0)
    run_rounds(dog, devices, 10.0, 0.2)
    assert gone == [0] and devices.killed == {}


def test_a_failing_round_does_not_end_the_watch() -> None:
    """A round that raises (a GCS hiccup, a kill racing a death) is reported; the thread goes
    on and still kills a device that freezes later."""
    import time

    calls = {"n": 0}
    devices = FakeDevices(2)

    def flaky_poll(refs: list[Any]) -> dict[Any, bool]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("GCS unavailable")
        return devices.poll(refs)

    dog = Watchdog(0.5, devices.ping, flaky_poll, devices.watched, devices.kill)
    try:
        time.sleep(0.3)
        devices.frozen.add(1)
        deadline = time.monotonic() + 10.0
        while not devices.killed and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        dog.stop()
    assert calls["n"] > 2 and list(devices.killed) == [1]


def test_a_silent_device_that_works_is_not_killed() -> None:
    """No answer, but its process uses CPU (a long native call holding the GIL): not hung.
    The same silence without CPU (a frozen process) is."""
    devices = FakeDevices(2)
    devices.frozen.update({0, 1})
    dog = Watchdog(2.0, devices.ping, devices.poll, devices.watched, devices.kill,
                   now=lambda: devices.now_s, start=False, working=lambda index: index == 0)
    run_rounds(dog, devices, 10.0, 0.2)
    assert list(devices.killed) == [1]


def test_hang_watch_and_interval() -> None:
    watch = HangWatch(5.0)
    assert watch.overdue([0, 1], 100.0) == []         # first sight counts from now
    watch.answered(0, 104.0)
    assert watch.overdue([0, 1], 105.5) == [1]
    assert ping_interval_s(30.0) == 3.0 and ping_interval_s(300.0) == 5.0
    assert ping_interval_s(2.0) == 0.2
