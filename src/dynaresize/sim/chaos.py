"""Random device deaths in the twin: the chaos campaign's trials (`bench/chaos.py`).

A trial draws, from its seed, a run variant (policy, staleness, checkpoint interval, a forced
resize or none) and 1-3 deaths. Each death names a *phase* (the `SimDevice` ops that make it
up, `PHASES`), *when* (the n-th call of those ops in the run, counted over every device, plus
a delay in virtual seconds after that call starts, so it lands inside the op or just after),
and *who* (the calling device, or a random live rollout or training device). A later death may
be armed by an earlier one (it counts calls only after that one fired): two deaths in one
recovery, or a death inside the world rebuild (`recovery`). The kill itself is
`SimProcesses.kill`, as `[[faults.kill]]` uses; the orchestrator's recovery does the rest.
With `hangs` = P, each death is a freeze with probability P instead (`SimProcesses.hang`:
nothing it runs finishes, its group's collectives wait, killed `Trap.hang_s` later, as the
live watchdog does), drawn from its own stream so that P = 0 draws the same trials.

`audit` checks a finished trial against the fault-free run of the same variant (the same
seed): every expected sample recorded once, with its version and length; every step's metric
record once; every surviving trainer holding the state after every step (the twin's stand-in
for equal parameters: `SimDevice` refuses an update on the wrong state); the last checkpoint
taken when the run's last step is a checkpoint step.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dynaresize.core.rundir import read_jsonl
from dynaresize.core.types import Role

PHASES: dict[str, tuple[str, ...]] = {
    "rollout": ("run_rollout",),
    "stream": ("train_accumulate",),
    "optimizer": ("train_step", "train_finish"),
    "weight_sync": ("publish_weights", "load_weights"),
    "resize": ("export_inflight", "release_kv", "join_group", "reshard",
               "commit_train_group", "alloc_kv", "drop_trainer", "release_rollout_weights"),
    "checkpoint": ("save_checkpoint",),
    "recovery": ("rebuild_world", "load_checkpoint"),
}
"""Phase -> the SimDevice ops whose calls make it up (evaluation is not modelled)."""

FIRST_PHASES = ("rollout", "stream", "optimizer", "weight_sync", "resize", "checkpoint")
VICTIMS = ("caller", "rollout", "train")


@dataclass(frozen=True)
class Death:
    phase: str
    """A key of `PHASES`, or one op of a phase (e.g. 'load_weights': tests)."""
    nth: int
    """Fires at the (nth + 1)-th call of the phase's ops (counted from `after` firing)."""
    delay_s: float
    """Virtual seconds after that call starts."""
    victim: str
    """'caller' | 'rollout' | 'train'."""
    after: int | None = None
    """Index of the death that arms this one (None: armed from the start)."""
    how: str = "kill"
    """'kill' | 'hang' (a freeze, killed `Trap.hang_s` later)."""


@dataclass(frozen=True)
class Variant:
    policy: str = "static"
    staleness: int = 1
    checkpoint_every: int = 0
    resize: str = ""
    """'' | 'rollout->train' | 'train->rollout': a forced resize at step 1."""


@dataclass(frozen=True)
class Trial:
    seed: int
    variant: Variant
    deaths: tuple[Death, ...]


def draw_variant(rng: np.random.Generator, phase: str) -> Variant:
    """A run variant in which `phase` happens."""
    policy = "hysteresis" if phase == "stream" else str(rng.choice(["static", "hysteresis"]))
    every = int(rng.integers(1, 3)) if phase == "checkpoint" else int(rng.integers(0, 3))
    resize = ""
    if phase == "resize" or (phase != "stream" and rng.random() < 0.25):
        resize = str(rng.choice(["rollout->train", "train->rollout"]))
    return Variant(policy, int(rng.integers(0, 3)), every, resize)  # staleness 0, 1 or 2


def draw_trial(seed: int, calls: Any, hangs: float = 0.0) -> Trial:
    """Trial `seed`: `calls(variant)` gives the fault-free run's call count per phase; each
    death a hang with probability `hangs` (module docstring)."""
    rng = np.random.default_rng([27, seed])
    phase = str(rng.choice(FIRST_PHASES))
    variant = draw_variant(rng, phase)
    counts = calls(variant)
    deaths = [Death(phase, int(rng.integers(0, max(1, counts.get(phase, 1)))),
                    float(rng.uniform(0.0, 2.0)), str(rng.choice(VICTIMS)))]
    for _ in range(int(rng.choice([0, 1, 2], p=[0.5, 0.3, 0.2]))):
        overlap = rng.random()
        if overlap < 0.3:  # at the same instant as the previous one
            prev = deaths[-1]
            deaths.append(Death(prev.phase, prev.nth, prev.delay_s, str(rng.choice(VICTIMS[1:])),
                                prev.after))
        elif overlap < 0.6:  # inside the recovery of the previous one
            deaths.append(Death("recovery", int(rng.integers(0, 64)),
                                float(rng.uniform(0.0, 1.0)), str(rng.choice(VICTIMS)),
                                len(deaths) - 1))
        else:  # later, in any phase of the run
            later = [p for p in FIRST_PHASES if counts.get(p)]
            p = str(rng.choice(later))
            deaths.append(Death(p, int(rng.integers(0, counts[p])),
                                float(rng.uniform(0.0, 2.0)), str(rng.choice(VICTIMS))))
    if hangs:
        hang_rng = np.random.default_rng([28, seed])
        deaths = [replace(d, how="hang") if hang_rng.random() < hangs else d for d in deaths]
    return Trial(seed, variant, tuple(deaths))


@dataclass
class Trap:
    """Counts the phases' calls on every device; fires a trial's deaths (kills later, in
    virtual time, through `processes.kill`)."""

    deaths: tuple[Death, ...]
    seed: int = 0
    hang_s: float = 30.0
    """A hung device is killed this long after it froze (`faults.hang_timeout_s`)."""
    calls: dict[str, int] = field(default_factory=dict)
    fired: list[int | None] = field(default_factory=list)
    """Per death: the device it killed (None: not fired; -1: no device to kill)."""

    def __post_init__(self) -> None:
        self.fired = [None] * len(self.deaths)
        self._counts = [0] * len(self.deaths)
        self._rng = np.random.default_rng([2027, self.seed])
        self._devices: list[Any] = []
        self._processes: Any = None

    def install(self, devices: list[Any], processes: Any) -> None:
        self._devices, self._processes = devices, processes
        for phase, ops in PHASES.items():
            for device in devices:
                for op in ops:
                    orig = getattr(device, op)
                    setattr(device, op, self._wrap(phase, device, orig))

    def _wrap(self, phase: str, device: Any, orig: Any) -> Any:
        @functools.wraps(orig)
        async def call(*args: Any, **kwargs: Any) -> Any:
            self._on_call(phase, orig.__name__, device)
            return await orig(*args, **kwargs)

        return call

    def _on_call(self, phase: str, op: str, caller: Any) -> None:
        self.calls[phase] = self.calls.get(phase, 0) + 1
        for i, death in enumerate(self.deaths):
            if self.fired[i] is not None or death.phase not in (phase, op):
                continue
            if death.after is not None and self.fired[death.after] is None:
                continue
            self._counts[i] += 1
            if self._counts[i] == death.nth + 1:
                victim = self._victim(death.victim, caller)
                self.fired[i] = -1 if victim is None else victim.index
                if victim is not None:
                    fire = functools.partial(self._processes.hang, after_s=self.hang_s) \
                        if death.how == "hang" else self._processes.kill
                    asyncio.get_running_loop().call_later(death.delay_s, fire, victim.index)

    def _victim(self, who: str, caller: Any) -> Any:
        if who == "caller" and caller.alive and not self._processes.is_frozen(caller.index):
            return caller
        role = Role.ROLLOUT if who == "rollout" else Role.TRAIN
        if who == "caller":
            role = caller.role
        frozen = self._processes.is_frozen
        pool = [d for d in self._devices if d.alive and not frozen(d.index) and d.role == role]
        if len(pool) <= 2:  # each pool keeps a device (as config refuses more kills)
            return None
        return pool[int(self._rng.integers(0, len(pool)))]

    @property
    def devices(self) -> list[Any]:
        return list(self._devices)

    @property
    def rng(self) -> np.random.Generator:
        return self._rng

    @property
    def processes(self) -> Any:
        return self._processes


def sample_view(records: list[dict[str, Any]]) -> dict[tuple[int, int, int], tuple[int, int]]:
    return {(s["step"], s["prompt"], s["sample"]): (s["version"], s["response_tokens"])
            for s in records}


def audit(out: Path, devices: list[Any], reference: dict[tuple[int, int, int], Any],
          steps: int, every: int) -> dict[str, Any]:
    """A finished trial's counts against the fault-free run (module docstring)."""
    records = read_jsonl(out / "samples.jsonl")
    keys = [(s["step"], s["prompt"], s["sample"]) for s in records]
    got = sample_view(records)
    both = set(got) & set(reference)
    metric_steps = [m["step"] for m in read_jsonl(out / "metrics.jsonl")]
    trainers = [d for d in devices if d.alive and d.train_steps is not None]
    row: dict[str, Any] = {
        "lost": len(set(reference) - set(got)), "duplicated": len(keys) - len(set(keys)),
        "wrong_version": sum(got[k][0] != reference[k][0] for k in both),
        "changed": sum(got[k][1] != reference[k][1] for k in both),
        "metrics_ok": metric_steps == list(range(steps)),
        "params_ok": bool(trainers) and all(d.train_steps == steps for d in trainers)}
    if every and steps % every == 0:  # the last step's checkpoint is there
        latest = out / "checkpoints" / "latest"
        row["final_checkpoint_ok"] = latest.is_file() and \
            latest.read_text().strip() == f"step-{steps:06d}"
    return row
