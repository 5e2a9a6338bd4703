"""Random device deaths on real Ray devices, in every phase: the live chaos campaign's trials
(`bench/chaos_live.py`).

The twin's trap (`sim.chaos.Trap`: phases as device ops, `sim.chaos.PHASES`) installed on a
live run's `RayDevice`s (`runner.run_training(chaos=...)`), so a death lands where the run
really is: a rollout slice, a streamed micro-batch, the optimizer step, a weight publish or an
engine loading weights, any resize op, a checkpoint save, or inside the recovery of an earlier
death (world rebuild, checkpoint restore). The kill is `DevicePool.kill` (SIGKILL of the
actor's process) or, for a drawn share `hang_p` of the deaths, `DevicePool.hang` (SIGSTOP: the
process freezes until the hang watchdog kills it, `faults.hang_timeout_s`); the recovery is
the orchestrator's own. Unlike `[[faults.kill]]`, the trap leaves the run's code path as it
is: streamed training and pipelined rollouts stay on.

A trial draws, from its seed, a variant of the default run (staleness 0, 1 or 2; a checkpoint
every 0 or 1 step; a forced rollout -> train resize at step 1 or none) and 1-2 deaths: the
first in a random phase that the variant's fault-free run has, at the n-th call of that phase's
ops (n drawn from the fault-free run's count) plus 0-0.3 s; a second one at the same instant,
inside the first one's recovery, or later in any phase. The victim is the calling device or a
random live device of a role (roles as the device's last ops show them). At least `MIN_ALIVE`
devices stay alive: a pool may be emptied (recovery reassigns a device of the other pool).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dynaresize.core.types import Role
from dynaresize.sim.chaos import FIRST_PHASES, VICTIMS, Death, Trap

MIN_ALIVE = 2
"""Live devices left by any trial (the run's recovery needs a device in each pool)."""
DRAWS = 8
"""Tries to draw a (phase, variant) whose fault-free run calls the phase at all."""
DELAY_S = 0.3
"""A death lands up to this many seconds after the call that arms it starts."""
RESIZE = "resize.schedule=[{step=1, at='start', move='rollout->train', num_devices=1}]"
ROLE_OF_PHASE = {"rollout": Role.ROLLOUT, "stream": Role.TRAIN, "optimizer": Role.TRAIN,
                 "checkpoint": Role.TRAIN}
"""The role a device's call of a phase shows (others: weight_sync, resize, recovery, by op)."""
ROLE_OF_OP = {"load_weights": Role.ROLLOUT, "publish_weights": Role.TRAIN,
              "alloc_kv": Role.ROLLOUT, "commit_train_group": Role.TRAIN}


def draw_variant(rng: np.random.Generator, phase: str) -> list[str]:
    """`--set` overrides of a variant of the default run in which `phase` happens."""
    staleness = int(rng.choice([0, 1, 2], p=[0.35, 0.45, 0.2]))
    every = 1 if phase == "checkpoint" else int(rng.integers(0, 2))
    variant = [f"run.staleness={staleness}", f"run.checkpoint_every={every}"]
    if phase == "resize" or rng.random() < 0.25:
        variant.append(RESIZE)
    return variant


def draw_live(seed: int, calls: Any) -> tuple[list[str], tuple[Death, ...]]:
    """Trial `seed`: (variant, deaths); `calls(variant)` gives the fault-free run's call
    count per phase."""
    rng = np.random.default_rng([2028, seed])
    for _ in range(DRAWS):  # a variant in which the phase happens (e.g. no stream at s = 0
        phase = str(rng.choice(FIRST_PHASES))  # with a resize)
        variant = draw_variant(rng, phase)
        counts = calls(variant)
        if counts.get(phase):
            break
    deaths = [Death(phase, int(rng.integers(0, max(1, counts.get(phase, 1)))),
                    float(rng.uniform(0.0, DELAY_S)), str(rng.choice(VICTIMS)))]
    if rng.random() < 0.4:
        kind = rng.random()
        if kind < 0.3:  # at the same instant, another device
            first = deaths[0]
            deaths.append(Death(first.phase, first.nth, first.delay_s,
                                str(rng.choice(VICTIMS[1:]))))
        elif kind < 0.6:  # inside the first one's recovery
            deaths.append(Death("recovery", int(rng.integers(0, 4)),
                                float(rng.uniform(0.0, DELAY_S)), str(rng.choice(VICTIMS)),
                                0))
        else:  # later, in any phase of the run
            later = [p for p in FIRST_PHASES if counts.get(p)]
            p = str(rng.choice(later))
            deaths.append(Death(p, int(rng.integers(0, counts[p])),
                                float(rng.uniform(0.0, DELAY_S)), str(rng.choice(VICTIMS))))
    return variant, tuple(deaths)


class LiveTrap(Trap):
    """`Trap` on live devices: liveness from the device pool (`processes.is_alive`), roles
    from each device's latest ops, at least `MIN_ALIVE` devices left alive, and a kill that
    tolerates a device already gone."""

    def __init__(self, deaths: tuple[Death, ...], seed: int = 0, hang_p: float = 0.0) -> None:
        super().__init__(deaths, seed)
        self.hang_p = hang_p
        """The share of deaths that freeze the process instead of killing it."""
        self.roles: dict[int, Role] = {}
        self.doomed: set[int] = set()
        """Devices a fired death has chosen (their kill may still be pending)."""

    def install(self, devices: list[Any], processes: Any) -> None:
        self.roles = {d.index: d.role for d in devices}
        super().install(devices, _Processes(processes, self._freeze))

    def _freeze(self) -> bool:
        """Whether the next death is a freeze (drawn from the trial's generator)."""
        return self.hang_p > 0 and float(self.rng.random()) < self.hang_p

    @property
    def hung(self) -> list[int]:
        """Devices frozen (SIGSTOP) rather than killed, in firing order."""
        return list(self.processes.hung) if self.processes is not None else []

    def _on_call(self, phase: str, op: str, caller: Any) -> None:
        role = ROLE_OF_PHASE.get(phase) or ROLE_OF_OP.get(op)
        if role is not None:
            self.roles[caller.index] = role
        super()._on_call(phase, op, caller)

    def alive(self, device: Any) -> bool:
        return device.index not in self.doomed and self.processes.is_alive(device.index)

    def _victim(self, who: str, caller: Any) -> Any:
        alive = [d for d in self.devices if self.alive(d)]
        if len(alive) <= MIN_ALIVE:
            return None
        if who == "caller" and self.alive(caller):
            victim = caller
        else:
            role = self.roles[caller.index] if who == "caller" else \
                (Role.ROLLOUT if who == "rollout" else Role.TRAIN)
            pool = [d for d in alive if self.roles.get(d.index) == role] or alive
            victim = pool[int(self.rng.integers(0, len(pool)))]
        self.doomed.add(victim.index)
        return victim


class _Processes:
    """The device pool as the trap uses it: a kill ignores a process already gone (a death
    the run has met meanwhile)."""

    def __init__(self, pool: Any, freeze: Callable[[], bool] | None = None) -> None:
        self._pool = pool
        self._freeze = freeze
        self.hung: list[int] = []

    def kill(self, index: int) -> None:
        try:
            if self._freeze is not None and self._freeze():
                self._pool.hang(index)
                self.hung.append(index)
            else:
                self._pool.kill(index)
        except ProcessLookupError:
            pass

    def is_alive(self, index: int) -> bool:
        return bool(self._pool.is_alive(index))


def describe(deaths: tuple[Death, ...], fired: list[int | None],
             hung: tuple[int, ...] = ()) -> str:
    """'optimizer#3+0.12s caller -> dev 2; recovery#0 ... (not fired)' for the table; a
    device in `hung` was frozen, not killed ('-> dev 2 frozen')."""
    parts = []
    for death, dev in zip(deaths, fired, strict=True):
        what = f"{death.phase}#{death.nth}+{death.delay_s:.2f}s {death.victim}"
        if death.after is not None:
            what += f" (after {death.after + 1})"
        parts.append(what + (" -> not fired" if dev is None else
                             " -> spared" if dev < 0 else f" -> dev {dev}"
                             + (" frozen" if dev in hung else "")))
    return "; ".join(parts)

