"""Resize executor: runs a ResizePlan's op DAG on the devices (the side effects).

Every op starts as soon as its dependencies are done, so deferrable work overlaps the device's
new role. Each op is written to events.jsonl as `resize.<op>` with `critical` and `bytes`; the
critical-path time of the resize is reported. Training state moves in two phases (`reshard`
builds the new group's trainers beside the old ones, `commit` swaps them in), so any failure
before `commit` rolls back to the old allocation with nothing lost: the old trainers are intact,
exported requests are already back in the queue, and released rollout engines are rebuilt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dynaresize.core.rundir import RunDir
from dynaresize.protocols import Clock, Device, WeightHandle
from dynaresize.resize.planner import GROUP, Op, ResizePlan, critical_path_s, group_ready_s


class ResizeHooks(Protocol):
    """What the executor needs from the orchestrator (rollout pool and policy versions)."""

    async def stop_admission(self, device: Device) -> None: ...

    def requeue(self, device: Device, exported: list[Any]) -> None: ...

    def start_serving(self, device: Device) -> None: ...

    def current_weights(self, for_devices: Sequence[int]) -> tuple[int, WeightHandle]: ...


class InjectedFailure(RuntimeError):
    """Raised by a test's failure injector."""


@dataclass
class ResizeReport:
    index: int
    ok: bool
    t_start: float
    t_end: float
    critical_path_s: float
    """Until the moved devices work in their new role (design §4)."""
    durations_s: dict[int, float] = field(default_factory=dict)
    bytes_moved: int = 0
    num_migrated: int = 0
    num_group_creations: int = 0
    error: str = ""
    group_ready_s: float = 0.0
    """Until the new training group holds its state (`commit`)."""


class CommittedResizeError(RuntimeError):
    """An op failed after the resize's commit: the new training group is in charge (the
    caller installs the target allocation; `report.ok` stays True), the error is the cause."""

    def __init__(self, report: ResizeReport) -> None:
        super().__init__(f"resize {report.index} failed after its commit: {report.error}")
        self.report = report


class ResizeExecutor:
    def __init__(self, devices: Sequence[Device], clock: Clock, rundir: RunDir,
                 hooks: ResizeHooks, staging_bytes: int,
                 fail: Callable[[int, Op], bool] | None = None) -> None:
        self.devices = list(devices)
        self.clock = clock
        self.rundir = rundir
        self.hooks = hooks
        self.staging_bytes = staging_bytes
        self.fail = fail or (lambda index, op: False)
        self.num_resizes = 0
        self.lost: set[int] = set()
        """Devices whose process died (`mark_lost`): no op calls them again."""
        self._generation = 1_000
        self._exports: list[asyncio.Future[None]] = []
        """`export_inflight` + requeue of the running resize (waited for on a rollback)."""

    def mark_lost(self, index: int) -> None:
        """Device `index`'s process died (recovery, through the resizer's `fence`)."""
        self.lost.add(index)

    async def execute(self, plan: ResizePlan, optimizer_step: int) -> ResizeReport:
        index = self.num_resizes
        self.num_resizes += 1
        self._generation += 1
        report = ResizeReport(index, True, self.clock.now(), 0.0, 0.0)
        self._exports = []
        done: dict[int, asyncio.Future[None]] = {}
        loop = asyncio.get_running_loop()
        for op in plan.ops:
            done[op.id] = loop.create_future()

        async def run(op: Op) -> None:
            await asyncio.gather(*(done[d] for d in op.deps))
            t0 = self.clock.now()
            num_bytes = await self._run_op(op, plan, report, optimizer_step)
            if self.fail(index, op):
                raise InjectedFailure(f"injected failure in resize {index} op {op.kind}")
            t1 = self.clock.now()
            report.durations_s[op.id] = t1 - t0
            for device in self._op_devices(op, plan):
                self.rundir.event(t0, t1, device, f"resize.{op.kind}", critical=op.critical,
                                  num_bytes=num_bytes if op.device != GROUP else 0,
                                  resize=index)
            done[op.id].set_result(None)

        tasks = [asyncio.ensure_future(run(op)) for op in plan.ops]
        try:
            await asyncio.gather(*tasks)
        except Exception as exc:  # roll back: nothing may be lost
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*self._exports, return_exceptions=True)  # requeued (or the
            self._exports.clear()  # device died: recovery reruns what it held)
            committed = any(op.kind == "commit" and op.id in report.durations_s
                            for op in plan.ops)
            if committed:  # past the point of no return: the new group is in charge
                report.error = f"{type(exc).__name__}: {exc}"[:300]
                report.t_end = self.clock.now()
                raise CommittedResizeError(report) from exc
            report.ok = False
            report.error = f"{type(exc).__name__}: {exc}"
            await self._rollback(plan)
        report.t_end = self.clock.now()
        report.critical_path_s = critical_path_s(plan, report.durations_s)
        report.group_ready_s = group_ready_s(plan, report.durations_s)
        for d in plan.to_train + plan.to_rollout:
            self.rundir.event(report.t_start, report.t_end, d, "resize", critical=True,
                              num_bytes=report.bytes_moved, resize=index, ok=report.ok,
                              critical_path_s=round(report.critical_path_s, 6),
                              group_ready_s=round(report.group_ready_s, 6),
                              migrated=report.num_migrated, error=report.error)
        return report

    def _op_devices(self, op: Op, plan: ResizePlan) -> list[int]:
        if op.device != GROUP:
            return [op.device]
        if op.kind == "join_group":
            return [d.index for d in self.devices]
        return sorted(set(plan.old_train) | set(plan.new_train))

    async def _run_op(self, op: Op, plan: ResizePlan, report: ResizeReport,
                      optimizer_step: int) -> int:
        """Run one op; return the bytes it moved."""
        kind = op.kind
        dev = self.devices[op.device] if op.device != GROUP else None
        members = [self.devices[i] for i in sorted(set(plan.old_train) | set(plan.new_train))] \
            if kind in ("reshard", "commit") else []  # O(N): only the group ops need them
        if kind == "stop_admission":
            await self.hooks.stop_admission(dev)
        elif kind == "export_inflight":  # shielded: a failing sibling op must not cancel
            export = asyncio.ensure_future(self._export(dev, report))  # it between the
            self._exports.append(export)  # device's export and the requeue (requests lost)
            await asyncio.shield(export)
        elif kind == "release_kv":
            await dev.release_kv()
        elif kind == "join_group":
            created = await asyncio.gather(*(d.join_group(plan.new_train) for d in self.devices
                                             if d.index not in self.lost))
            report.num_group_creations += sum(bool(c) for c in created)
        elif kind == "reshard":
            stats = await asyncio.gather(*(
                d.reshard(plan.old_train, plan.new_train, self._generation, optimizer_step,
                          self.staging_bytes) for d in members))
            moved = sum(int(s.get("bytes_sent", 0)) for s in stats)
            report.bytes_moved += moved
            return moved
        elif kind == "commit":
            await self._commit(op, plan, report, members)
        elif kind == "release_rollout_weights":
            await dev.release_rollout_weights()
        elif kind == "load_weights":
            version, handle = self.hooks.current_weights((dev.index,))
            await dev.load_weights(version, handle)
        elif kind == "alloc_kv":
            await dev.alloc_kv()
        elif kind == "start_serving":
            self.hooks.start_serving(dev)
        elif kind == "drop_trainer":
            await dev.drop_trainer()
        else:
            raise ValueError(f"unknown op kind {kind!r}")
        return 0

    async def _commit(self, op: Op, plan: ResizePlan, report: ResizeReport,
                      members: list[Device]) -> None:
        """Every member swaps in its side of the new group (a local swap, no collective). If
        one fails (died) while others swapped, the new group is in charge all the same: the
        op counts as done (`report.durations_s`), so the failure is after the commit
        (`CommittedResizeError`), not a rollback to trainers that are gone."""
        t0 = self.clock.now()
        got = await asyncio.gather(*(d.commit_train_group(plan.new_train) for d in members),
                                   return_exceptions=True)
        errors = [g for g in got if isinstance(g, BaseException)]
        if errors and len(errors) < len(got):
            report.durations_s[op.id] = self.clock.now() - t0
        if errors:
            raise errors[0]

    async def _export(self, dev: Device, report: ResizeReport) -> None:
        exported = await dev.export_inflight()
        report.num_migrated += len(exported)
        self.hooks.requeue(dev, exported)

    async def _rollback(self, plan: ResizePlan) -> None:
        """Back to `plan.source`: discard new trainers; rollout devices serve again; devices
        that were about to leave training (and may already serve) go back to it. A rollout
        device the failed resize stopped but did not export yet (a sibling op failed first)
        hands its requests back before it serves again. Each device is rolled back even if
        another one fails (e.g. died); the first error is raised at the end."""
        members = [self.devices[i] for i in sorted(set(plan.old_train) | set(plan.new_train))]
        got = await asyncio.gather(*(d.abort_reshard() for d in members), return_exceptions=True)
        errors = [e for e in got if isinstance(e, Exception)]
        version, handle = self.hooks.current_weights(plan.to_train)
        for i in plan.to_train:
            dev = self.devices[i]
            try:
                await self.hooks.stop_admission(dev)
                self.hooks.requeue(dev, await dev.export_inflight())
                await dev.alloc_kv()
                await dev.load_weights(version, handle)
                self.hooks.start_serving(dev)
            except Exception as exc:
                errors.append(exc)
        for i in plan.to_rollout:  # it may already serve: its requests go back to the queue
            dev = self.devices[i]
            try:
                await self.hooks.stop_admission(dev)
                self.hooks.requeue(dev, await dev.export_inflight())
                await dev.release_rollout_weights()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
