"""Fault injection: `[[faults.kill]]` entries kill devices (tests, drills, the twin).

```toml
[[faults.kill]]
device = 1          # device index
step = 1            # RL step
at = "rollout:0.3"  # once 30% of the step's requests finished | "train" | "resize"
how = "kill"        # SIGKILL | "hang": SIGSTOP, found by the watchdog (faults.hang_timeout_s)
```

- `rollout:F`: fires from the rollout loop's progress callback once the fraction F of the step's
  requests has finished (F = 0: as soon as the first completions arrive);
- `train`: fires while step `step`'s optimizer step runs (after every rank got its
  micro-batches, `TRAIN_KILL_DELAY_S` into the step);
- `resize`: fires inside the first resize of step `step`, right after its `join_group` op
  (before `reshard`, so the resize is mid-way and must roll back).

The injector only decides *when*; `kill(device)` is the backend's (`DevicePool.kill`: SIGKILL
of the actor's process; the twin's `sim.faults.SimProcesses.kill`: a simulated death, in
virtual time), and so is `hang(device)` (`DevicePool.hang`: SIGSTOP; the twin's
`SimProcesses.hang`: a frozen simulated process, killed `faults.hang_timeout_s` later).
Recovery is `recovery.Recovery`'s job. Each entry fires once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dynaresize.config import ConfigError, KillEntry
from dynaresize.resize.planner import Op

TRAIN_KILL_DELAY_S = 0.05
"""How far into a training step a `train` kill lands (the step's collectives are running)."""


@dataclass
class Fired:
    """One kill that happened."""

    device: int
    step: int
    at: str
    t_s: float
    how: str = "kill"


class FaultInjector:
    def __init__(self, entries: list[KillEntry], kill: Callable[[int], None],
                 now: Callable[[], float], hang: Callable[[int], None] | None = None
                 ) -> None:
        for i, e in enumerate(entries):
            if e.how == "hang" and hang is None:
                raise ConfigError(f"faults.kill[{i}].how", e.how,
                                  "'kill' only here: this backend cannot freeze a device "
                                  "(the Ray backend and the twin can)")
        self._pending = list(entries)
        self._kill = kill
        self._hang = hang
        self._now = now
        self.fired: list[Fired] = []

    def _fire(self, due: list[KillEntry]) -> list[int]:
        for e in due:
            self._pending.remove(e)
            if e.how == "hang" and self._hang is not None:
                self._hang(e.device)
            else:
                self._kill(e.device)
            self.fired.append(Fired(e.device, e.step, e.at, self._now(), e.how))
        return [e.device for e in due]

    def at_rollout(self, step: int, fraction: float) -> list[int]:
        """Kill the devices due at this step once `fraction` of its requests finished."""
        return self._fire([e for e in self._pending if e.step == step
                           and e.at.startswith("rollout:")
                           and float(e.at.split(":", 1)[1]) <= fraction])

    async def during_train(self, step: int) -> list[int]:
        """Call as a step's training starts: kills `train` entries of `step` mid-step."""
        due = [e for e in self._pending if e.step == step and e.at == "train"]
        if not due:
            return []
        await asyncio.sleep(TRAIN_KILL_DELAY_S)
        return self._fire(due)

    def in_resize(self, step: int, op: Op) -> bool:
        """The executor's per-op hook: after `join_group` of a resize in `step`, kill the
        `resize` entries of that step. Never asks the executor to fail (returns False)."""
        if op.kind == "join_group":
            self._fire([e for e in self._pending if e.step == step and e.at == "resize"])
        return False

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def pending(self) -> list[KillEntry]:
        """Entries that have not fired (e.g. a `resize` kill in a step without a resize)."""
        return list(self._pending)

    def resize_hook(self, step: Callable[[], int],
                    fail_op: Callable[[int, Op], bool] | None = None
                    ) -> Callable[[int, Op], bool]:
        """The executor's `fail(resize_index, op)`: `resize` kills of the step the rollout
        loop is at (`step()`), then `fail_op` (failure injection, tests)."""
        def hook(index: int, op: Op) -> bool:
            return self.in_resize(step(), op) or bool(fail_op and fail_op(index, op))
        return hook

    def summary(self, records: list[dict[str, Any]], with_pending: bool = False
                ) -> dict[str, Any]:
        """The run summary's fault keys (recovery's `records`, the kills that fired and,
        `with_pending`, those that never did); empty for a run without faults."""
        if not self.fired and not records and not (with_pending and self._pending):
            return {}
        out: dict[str, Any] = {"num_faults": len(records), "faults": records,
                               "kills": [vars(f) for f in self.fired]}
        if with_pending:
            out["kills_not_fired"] = [vars(e) for e in self._pending]
        return out
