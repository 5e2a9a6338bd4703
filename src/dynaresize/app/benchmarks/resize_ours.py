"""Our resize, measured: the ResizeExecutor on a DevicePool, op by op (design §4).

Consumes a started `DevicePool` of 4 devices and a config; produces one `ResizeMeasurement`
per resize of a fixed sequence that starts and ends at 2 rollout / 2 train devices:

    r→t first   {2,3} → {1,2,3}   (new membership: group creation on the path)
    t→r back    {1,2,3} → {2,3}
    t→r first   {2,3} → {3}       (new membership)
    r→t back    {3} → {2,3}
    then `repeats` times: r→t repeat, t→r back, t→r repeat, r→t back (cached groups only)

Training groups are suffixes of the device list (the planner moves the highest rollout /
lowest train device), so with 4 devices these are the only memberships; the pool must be fresh
for the "first" rows to create groups. The devices hold real training state (one optimizer
step on synthetic samples, so the AdamW moments exist) and the rollout side loads a real
published weight handle, exactly as in a run. No rollout requests are in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dynaresize.config import Config
from dynaresize.core.allocation import Allocation
from dynaresize.core.rundir import RunDir
from dynaresize.core.types import TrainSample
from dynaresize.protocols import Device, RealClock, WeightHandle
from dynaresize.resize.executor import ResizeExecutor, ResizeReport
from dynaresize.resize.planner import (
    ResizePlan,
    critical_chain,
    plan_resize,
    target_allocation,
)
from dynaresize.train.batching import global_num_tokens, plan_step

SEQUENCE_FIRST = (("rollout->train", "first"), ("train->rollout", "back"),
                  ("train->rollout", "first"), ("rollout->train", "back"))
SEQUENCE_REPEAT = (("rollout->train", "repeat"), ("train->rollout", "back"),
                   ("train->rollout", "repeat"), ("rollout->train", "back"))


@dataclass
class OpTiming:
    kind: str
    device: int
    critical: bool
    duration_s: float
    on_critical_path: bool


@dataclass
class ResizeMeasurement:
    """One resize as our executor ran it."""

    move: str
    label: str
    """'first' (new membership), 'repeat' (same move, cached group) or 'back'."""
    source: str
    target: str
    ok: bool
    critical_path_s: float
    """Until the moved device works in its new role (design §4)."""
    group_ready_s: float
    """Until the new training group holds its state (the trainers' next step waits)."""
    wall_s: float
    num_group_creations: int
    bytes_moved: int
    peak_staging_bytes: int
    staging_bytes: int
    reshard_transfer_s: float = 0.0
    """Slowest device's transfer part of `reshard` (the rest builds the new trainers)."""
    ops: list[OpTiming] = field(default_factory=list)

    def path_shares(self) -> dict[str, float]:
        """Op kind → fraction of the critical path (ops on the longest chain)."""
        out: dict[str, float] = {}
        for op in self.ops:
            if op.on_critical_path and self.critical_path_s > 0:
                out[op.kind] = out.get(op.kind, 0.0) + op.duration_s / self.critical_path_s
        return out


class BenchHooks:
    """ResizeHooks without a rollout run: nothing in flight, a fixed published version."""

    def __init__(self, version: int, handle: WeightHandle) -> None:
        self.version = version
        self.handle = handle
        self.num_exported = 0

    async def stop_admission(self, device: Device) -> None:
        return None

    def requeue(self, device: Device, exported: list[Any]) -> None:
        self.num_exported += len(exported)

    def start_serving(self, device: Device) -> None:
        return None

    def current_weights(self, for_devices: Sequence[int]) -> tuple[int, WeightHandle]:
        return self.version, self.handle


class RecordingDevice:
    """A Device that delegates to another and keeps the per-device stats of every reshard
    (bytes, measured peak staging), which the ResizeReport sums away."""

    def __init__(self, inner: Any, log: list[dict[str, float]]) -> None:
        self._inner = inner
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def reshard(self, *args: Any) -> dict[str, float]:
        stats = await self._inner.reshard(*args)
        self._log.append(stats)
        return stats


def synthetic_samples(num_samples: int, prompt_len: int, response_len: int
                      ) -> list[TrainSample]:
    """A small, fixed GRPO batch (token ids < 16) for the warm-up optimizer step."""
    return [TrainSample(step=0, prompt=i // 2, sample=i % 2,
                        prompt_tokens=[(3 + i + j) % 16 for j in range(prompt_len)],
                        response_tokens=[(5 + 2 * i + j) % 16 for j in range(response_len)],
                        behavior_logprobs=[-2.5] * response_len,
                        advantage=1.0 if i % 2 else -1.0, reward=float(i % 2))
            for i in range(num_samples)]


async def _prepare(devices: list[Any], alloc: Allocation, cfg: Config) -> WeightHandle:
    """Configure roles, form the training group, run one optimizer step, publish version 1."""
    await asyncio.gather(*(d.start() for d in devices))
    await asyncio.gather(*(d.join_train_group(alloc.train, 0) for d in devices))
    trainers = [devices[i] for i in alloc.train]
    samples = synthetic_samples(4, 6, 8)
    plan = plan_step(samples, cfg.train.micro_batch_size, len(trainers))
    tokens = global_num_tokens(samples)
    await asyncio.gather(*(d.train_step(0, plan[r], tokens) for r, d in enumerate(trainers)))
    handles = await asyncio.gather(*(d.publish_weights(1) for d in trainers))
    return handles[0]


def _measure(plan: ResizePlan, report: ResizeReport, label: str, move: str,
             reshard_log: list[dict[str, float]], staging_bytes: int) -> ResizeMeasurement:
    _, chain = critical_chain(plan, report.durations_s)
    ops = [OpTiming(op.kind, op.device, op.critical, report.durations_s.get(op.id, 0.0),
                    op.id in chain) for op in plan.ops]
    return ResizeMeasurement(
        move=move, label=label, source=plan.source.describe(), target=plan.target.describe(),
        ok=report.ok, critical_path_s=report.critical_path_s,
        group_ready_s=report.group_ready_s,
        wall_s=report.t_end - report.t_start, num_group_creations=report.num_group_creations,
        bytes_moved=report.bytes_moved,
        peak_staging_bytes=int(max((s.get("peak_staging_bytes", 0) for s in reshard_log),
                                   default=0)),
        staging_bytes=staging_bytes, ops=ops,
        reshard_transfer_s=max((s.get("reshard_s", 0.0) for s in reshard_log), default=0.0))


async def run_sequence(pool: Any, cfg: Config, repeats: int,
                       progress: Any = print) -> list[ResizeMeasurement]:
    """Run the sequence of the module docstring on `pool` (4 fresh devices); return every
    resize measured, in order. Leaves the devices at 2 rollout / 2 train devices."""
    if pool.num_devices != 4 or cfg.num_devices != 4:
        raise ValueError("the resize benchmark runs on exactly 4 devices")
    alloc = Allocation.initial(2, 2)
    log: list[dict[str, float]] = []
    from dynaresize.devices.settings import DeviceSettings
    from dynaresize.tasks import make_task

    settings = DeviceSettings.build(cfg, make_task(cfg).tokenizer)
    devices = [RecordingDevice(d, log) for d in pool.devices(settings, alloc.roles)]
    handle = await _prepare(devices, alloc, cfg)
    hooks = BenchHooks(1, handle)
    executor = ResizeExecutor(devices, RealClock(), RunDir(None), hooks,
                              cfg.resize.staging_bytes)
    out: list[ResizeMeasurement] = []
    for move, label in SEQUENCE_FIRST + SEQUENCE_REPEAT * repeats:
        plan = plan_resize(alloc, target_allocation(alloc, move, 1))
        log.clear()
        report = await executor.execute(plan, optimizer_step=1)
        if not report.ok:
            raise RuntimeError(f"resize {move} failed: {report.error}")
        alloc = plan.target
        m = _measure(plan, report, label, move, log, cfg.resize.staging_bytes)
        out.append(m)
        progress(f"  ours {move} ({label}, {m.source} → {m.target}): critical path "
                 f"{m.critical_path_s * 1e3:.0f} ms, {m.num_group_creations} group creations")
    assert alloc.roles == Allocation.initial(2, 2).roles, alloc.describe()
    return out


async def save_checkpoint(pool: Any, train: tuple[int, ...], path: str) -> dict[str, float]:
    """Collective over `train`: DCP checkpoint of the training state (for the naive path)."""
    stats = await asyncio.gather(*(pool.actors[i].save_checkpoint.remote(path) for i in train))
    sums = await asyncio.gather(*(pool.actors[i].param_checksum.remote() for i in train))
    return {"save_s": max(s["save_s"] for s in stats),
            "checkpoint_bytes": max(s["checkpoint_bytes"] for s in stats),
            "param_sum": float(sums[0][0])}
