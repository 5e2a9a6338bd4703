"""Device deaths and checkpoint storage of the digital twin: the sim side of `RecoveryOps`.

`SimProcesses` is the twin's process table, the stand-in of `DevicePool` for `recovery.py` and
`orchestrator/fault_injection.py`: `kill(index)` kills a simulated device, `is_alive(index)`
is what recovery's "is the process gone?" check asks, `new_store()` names a fresh rendezvous
(nothing listens).

What a death does, as it does to a Ray actor killed with SIGKILL:

- every call on the dead device raises `DeviceDied`, the in-flight ones at the moment of the
  kill (their virtual-time wait fails), later ones at once;
- an in-flight *collective* (train step, publish, reshard, checkpoint...) of the dead device's
  training group fails on every surviving member too, with `CollectiveFailed` (gloo: "connection
  closed by peer"); survivors stay alive, so recovery fences only the dead device.

A hang (`hang(index, after_s)`, `[[faults.kill]] how = "hang"`) freezes the device's process
(`SimProcess.freeze`): nothing it runs finishes, and its training group's collectives (the
group it was in when it froze) wait for it, as a SIGSTOPped actor's gloo peers do. `after_s`
later (`faults.hang_timeout_s`: the live watchdog's silence bound) it is killed as above,
with `cause` "hung: ...", and recovery takes over (unless another death took it first).

`SimStorage` is the twin's shared file system for checkpoints: a training group's
`save_checkpoint(path)` records how many optimizer steps the saved state holds, and
`load_checkpoint(path, k)` fails if nothing was saved there or the state is not step k.
"""

from __future__ import annotations

import asyncio
from typing import Any


class DeviceDied(RuntimeError):
    """A call on a simulated device whose process was killed (Ray: `ActorDiedError`)."""


class CollectiveFailed(RuntimeError):
    """A collective whose group lost a member mid-call (gloo: connection closed by peer)."""


class SimProcesses:
    """The process table of a run's simulated devices (see the module docstring)."""

    def __init__(self) -> None:
        self.devices: dict[int, Any] = {}
        """index -> SimDevice, filled by `make_devices`."""
        self.killed: list[int] = []
        self._num_stores = 0
        self._causes: dict[int, str] = {}
        self._holds: dict[int, tuple[int, ...]] = {}
        """A frozen device -> the peers whose collectives wait for it."""

    def add(self, device: Any) -> None:
        self.devices[device.index] = device

    def kill(self, index: int) -> None:
        """Kill device `index` now (idempotent)."""
        device = self.devices[index]
        if not device.alive:
            return
        self.killed.append(index)
        group = device.train_members
        device.process.die(DeviceDied(f"simulated device {index} died (killed)"))
        for peer in self._holds.pop(index, ()):
            self.devices[peer].process.hold_collectives(index, False)
            if peer not in group:  # a peer of the group it froze in
                self.devices[peer].process.fail_collectives(CollectiveFailed(
                    f"simulated device {peer}: a collective lost hung device {index}"))
        for peer in group:
            if peer != index:
                self.devices[peer].process.fail_collectives(CollectiveFailed(
                    f"simulated device {peer}: a collective of group {_short(group)} lost "
                    f"device {index}"))

    def is_alive(self, index: int) -> bool:
        return self.devices[index].alive

    def is_frozen(self, index: int) -> bool:
        """Hung (`hang`) and not yet killed."""
        device = self.devices[index]
        return device.alive and device.process.frozen

    def hang(self, index: int, after_s: float) -> None:
        """Freeze device `index` now; kill it `after_s` virtual seconds later (the watchdog).
        Call from inside the run's event loop."""
        device = self.devices[index]
        if not device.alive or device.process.frozen:
            return
        device.process.freeze()
        peers = tuple(p for p in device.train_members if p != index)
        self._holds[index] = peers
        for peer in peers:
            self.devices[peer].process.hold_collectives(index)
        asyncio.get_running_loop().call_later(after_s, self._watchdog_kill, index, after_s)

    def _watchdog_kill(self, index: int, after_s: float) -> None:
        """The watchdog's kill of a hung device (unless another death took it first)."""
        if self.devices[index].alive:
            self._causes[index] = f"hung: answered no ping for {after_s:.1f} s, killed"
            self.kill(index)

    def cause(self, index: int) -> str | None:
        """Why device `index` died beyond "the process is gone": a hang's, else None."""
        return self._causes.get(index)

    def new_store(self) -> str:
        """A fresh rendezvous name for a rebuilt world (nothing is created)."""
        self._num_stores += 1
        return f"sim://world-{self._num_stores}"


def _short(members: tuple[int, ...]) -> str:
    if len(members) <= 6:
        return str(members)
    return f"({members[0]}, {members[1]}, ..., {members[-1]}; {len(members)} ranks)"


class SimStorage:
    """Checkpoints of a twin run: path -> optimizer steps the saved training state holds."""

    def __init__(self) -> None:
        self.saved: dict[str, int] = {}

    def save(self, path: str, optimizer_steps: int) -> None:
        got = self.saved.setdefault(path, optimizer_steps)
        if got != optimizer_steps:
            raise RuntimeError(f"checkpoint {path}: ranks saved states after {got} and "
                               f"{optimizer_steps} optimizer steps")

    def load(self, path: str, optimizer_steps: int) -> None:
        got = self.saved.get(path)
        if got is None:
            raise FileNotFoundError(f"checkpoint {path}: nothing was saved there")
        if got != optimizer_steps:
            raise RuntimeError(f"checkpoint {path} holds the state after {got} optimizer "
                               f"steps, not {optimizer_steps}")


def fail_waits(waits: set[Any], exc: BaseException) -> None:
    """Fail the pending virtual-time waits in `waits` with `exc` (and forget them all)."""
    for wait in waits:
        if isinstance(wait, asyncio.Future) and not wait.done():
            wait.set_exception(exc)
    waits.clear()
