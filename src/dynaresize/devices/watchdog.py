"""Hang detection: a device process that stops answering is killed, so recovery sees a death.

A device whose process freezes (SIGSTOP, a host stall, blocked in the kernel) neither
answers nor dies: every driver call on it, and every collective its peers run with it,
waits. The driver pings each device in the actors' control concurrency group (which answers
while the device is busy in a rollout, a train step or a collective); a device that has
answered no ping for `faults.hang_timeout_s`, and (on this machine) used no CPU meanwhile,
is killed (`DevicePool.kill`), and from then on it is a death like any other: its calls
raise `ActorDiedError`, its peers' collectives fail at once (its sockets close), and
`recovery.Recovery` fences it and goes on with the survivors.

What it does not find: a device whose process answers pings while one of its ops never
returns (a deadlocked collective is bounded by `faults.timeout_s` instead; a CUDA hang by
torch's own watchdog, which ends the process), or one spinning in native code on this
machine (silent, but burning CPU like a long legitimate call holding the GIL).

`HangWatch` is the pure decision (what answered when, who is overdue); `Watchdog` is the
thread that sends the pings and kills.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any


class HangWatch:
    """Which devices have answered no ping for `timeout_s` (pure: the caller passes the time)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._last_answer_s: dict[int, float] = {}

    def answered(self, index: int, now_s: float) -> None:
        self._last_answer_s[index] = now_s

    def reset(self, indices: Iterable[int], now_s: float) -> None:
        """Count `indices` as answering now (new devices, replaced ones, a new watch)."""
        for i in indices:
            self._last_answer_s[i] = now_s

    def silent_s(self, index: int, now_s: float) -> float:
        return now_s - self._last_answer_s.get(index, now_s)

    def overdue(self, watched: Iterable[int], now_s: float) -> list[int]:
        """The watched devices silent for longer than `timeout_s` (one seen for the first
        time counts from now)."""
        out = []
        for i in watched:
            self._last_answer_s.setdefault(i, now_s)
            if self.silent_s(i, now_s) > self.timeout_s:
                out.append(i)
        return out


def ping_interval_s(timeout_s: float) -> float:
    """How often to ping: ten pings per timeout, at most every 5 s."""
    return min(timeout_s / 10.0, 5.0)


class Watchdog:
    """A daemon thread pinging the watched devices and killing the overdue ones.

    `ping(index)`: send one ping, return a handle (a Ray object ref); `poll(handles)`: the
    handles whose answer came, each with whether it is an answer (False: an error, the actor
    died); `watched()`: the indices to watch now (live, not already killed); `kill(index,
    silent_s)`: end a hung device; `dead(index)`: a ping failed, the device died by itself
    (recovery finds that death; the caller stops watching it); `working(index)`: whether the
    device's process used CPU since the last round (a long native call holding the GIL delays
    pings but burns CPU: counted as an answer; a frozen process burns none; None where it
    cannot be told, another machine). One ping per device is in flight at a time.
    `start=False`: no thread (tests call `tick`)."""

    def __init__(self, timeout_s: float, ping: Callable[[int], Any],
                 poll: Callable[[list[Any]], dict[Any, bool]],
                 watched: Callable[[], list[int]], kill: Callable[[int, float], None],
                 now: Callable[[], float] = time.monotonic, start: bool = True,
                 dead: Callable[[int], None] = lambda index: None,
                 working: Callable[[int], bool | None] = lambda index: None) -> None:
        self.watch = HangWatch(timeout_s)
        self._working = working
        self._ping = ping
        self._poll = poll
        self._watched = watched
        self._kill = kill
        self._dead = dead
        self._now = now
        self._outstanding: dict[int, Any] = {}
        self._stop = threading.Event()
        self.watch.reset(watched(), now())
        self._last_round_s = now()
        self._thread = threading.Thread(target=self._loop, name="dynaresize-watchdog",
                                        daemon=True)
        if start:
            self._thread.start()

    def stop(self) -> None:
        """End the thread; once this returns, no round runs (a round never blocks: polls do
        not wait, kills are signals)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _loop(self) -> None:
        interval_s = ping_interval_s(self.watch.timeout_s)
        reported: set[str] = set()
        while not self._stop.wait(interval_s):
            try:
                self.tick()
            except Exception as exc:  # one round failed (a GCS hiccup): the next may not
                if repr(exc) not in reported:
                    reported.add(repr(exc))
                    print(f"dynaresize: hang watchdog: a round failed: {exc!r}",
                          file=sys.stderr)

    def tick(self) -> list[int]:
        """One round: collect answers, ping who has no ping in flight, kill the overdue.
        Returns the devices killed."""
        watched = self._watched()
        now_s = self._now()
        if now_s - self._last_round_s > self.watch.timeout_s / 2:
            self.watch.reset(watched, now_s)  # this process stalled, not the devices
        self._last_round_s = now_s
        index_of = {id(ref): i for i, ref in self._outstanding.items()}
        done = self._poll(list(self._outstanding.values())) if index_of else {}
        died: set[int] = set()
        for ref, ok in done.items():
            index = index_of[id(ref)]
            del self._outstanding[index]
            if ok:
                self.watch.answered(index, now_s)
            else:
                self._dead(index)
                died.add(index)
        watched = [i for i in watched if i not in died]
        for i in watched:
            if self._working(i):
                self.watch.answered(i, now_s)
        for i in watched:
            if i not in self._outstanding:
                self._outstanding[i] = self._ping(i)
        overdue = self.watch.overdue(watched, now_s)
        for i in overdue:
            self._kill(i, self.watch.silent_s(i, now_s))
            self._outstanding.pop(i, None)
        return overdue
