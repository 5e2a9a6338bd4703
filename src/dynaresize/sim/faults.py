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
        for peer in group:
            if peer != index:
                self.devices[peer].process.fail_collectives(CollectiveFailed(
                    f"simulated device {peer}: a collective of group {_short(group)} lost "
                    f"device {index}"))

    def is_alive(self, index: int) -> bool:
        return self.devices[index].alive

    def cause(self, index: int) -> str | None:
        """Nothing beyond "the process is gone": the twin injects deaths only."""
        return None

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
