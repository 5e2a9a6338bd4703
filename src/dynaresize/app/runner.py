"""`dynaresize train`: place devices → start rollout → loop { generate → train → sync }.

Wires the pieces (task, device pool, orchestrator, run directory, progress) and drives the
orchestrator; owns the devices and stops every process it started, on success and on failure.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dynaresize.app.progress import Progress
from dynaresize.config import Config, to_toml
from dynaresize.core.allocation import Allocation
from dynaresize.core.rundir import RunDir
from dynaresize.protocols import RealClock


def _save_model(handle: Any, path: Path) -> None:
    import ray
    import torch

    torch.save(ray.get(handle), path)


class RayWeightIO:
    """Full weights between a Ray object (a WeightHandle) and a file, for checkpoints."""

    @staticmethod
    def save(handle: Any, path: Path) -> None:
        _save_model(handle, path)

    @staticmethod
    def load(path: Path) -> Any:
        import ray
        import torch

        return ray.put(torch.load(path, weights_only=True))


class RunStopped(RuntimeError):
    """`stop_after_steps` ended the run early (a stand-in for a pre-emption in tests)."""


def run_training(cfg: Config, out_dir: str | Path | None, *, address: str | None = None,
                 pool: Any = None, progress: Progress | None = None,
                 fail_op: Any = None, resume: bool = False,
                 stop_after_steps: int | None = None) -> dict[str, Any]:
    """Run `cfg` on Ray devices; write the run directory; return summary.json's content.

    `pool`: an existing DevicePool to reuse (tests share one per session); else one is
    started for this run, on the Ray cluster at `address` (default: `ray.address`), or on a
    local Ray cluster on loopback if that is empty.
    `fail_op(resize_index, op) -> bool`: failure injection for tests.
    `resume`: continue `out_dir` from its latest checkpoint (see `checkpoint`).
    `stop_after_steps`: raise RunStopped once that many steps are done (tests)."""
    from dynaresize.app.metric_sinks import make_sinks
    from dynaresize.devices.ray_device import DevicePool, ensure_ray
    from dynaresize.evaluation.worker import start_ray_evaluator, stop_ray_evaluator
    from dynaresize.orchestrator import Orchestrator
    from dynaresize.orchestrator.checkpoint import CheckpointTarget
    from dynaresize.orchestrator.checkpoint_files import read_latest, started_without_checkpoint
    from dynaresize.orchestrator.faults import FaultInjector
    from dynaresize.tasks import make_task

    progress = progress or Progress(cfg.run.steps, cfg.output.progress)
    resume_from = None
    if resume and started_without_checkpoint(out_dir):  # stopped before its first one
        progress.message(f"{out_dir}: no checkpoint yet: the run starts over from step 0")
    elif resume:
        resume_from = read_latest(out_dir, progress.message)
        num_done = resume_from[1].num_steps
        cfg.resize.schedule = [e for e in cfg.resize.schedule if e.step >= num_done]
    rundir = RunDir(out_dir, resume_step=resume_from[1].num_steps if resume_from else
                    (0 if resume else None))
    rundir.write_config(to_toml(cfg))
    started_ray = False
    own_pool = pool is None
    evaluator = None
    try:
        if own_pool:
            alloc = Allocation.initial(cfg.allocation.num_rollout_devices,
                                       cfg.allocation.num_train_devices)
            address = address or cfg.ray.address
            where = f"the Ray cluster at {address}" if address else \
                "a local Ray cluster (loopback)"
            progress.message(f"starting {cfg.num_devices} {cfg.devices.type} devices "
                             f"({alloc.describe()}) on {where}")
            started_ray = ensure_ray(address, num_cpus=max(
                cfg.num_devices * cfg.devices.threads_per_device, 2))
            pool = DevicePool(cfg.num_devices, cfg.devices.type,
                              cfg.devices.threads_per_device, cfg.faults.timeout_s,
                              cfg.ray.placement, cfg.ray.placement_timeout_s,
                              cfg.devices.gpus_per_device)
        rundir.node_of = pool.node_of
        assert pool.num_devices == cfg.num_devices
        alloc = Allocation.initial(cfg.allocation.num_rollout_devices,
                                   cfg.allocation.num_train_devices)
        devices = pool.devices(cfg.to_dict(), alloc.roles)
        task = make_task(cfg)
        # issue 18: metric sinks and held-out evaluation (evaluation.worker: its own Ray actor)
        rundir.sinks = make_sinks(cfg, rundir.path, progress.message)
        evaluator = start_ray_evaluator(cfg, rundir.eval_result, progress.message)

        def on_step(record: dict[str, Any]) -> None:
            progress.step(record)
            if stop_after_steps is not None and record["step"] + 1 >= stop_after_steps:
                raise RunStopped(f"stopped after {stop_after_steps} steps")

        checkpoints = None
        if rundir.path is not None and (cfg.run.checkpoint_every or resume_from):
            checkpoints = CheckpointTarget(rundir.path, cfg.run.checkpoint_every, RayWeightIO())
        clock = RealClock()
        injector = FaultInjector(cfg.faults.kill, pool.kill, clock.now)

        def fail_or_kill(index: int, op: Any) -> bool:
            return injector.in_resize(orch.state.step, op) or bool(fail_op and fail_op(index, op))

        orch = Orchestrator(cfg, devices, clock, task, rundir, on_step=on_step,
                            fail_op=fail_or_kill, checkpoints=checkpoints,
                            resume_from=resume_from, faults=pool,
                            injector=injector if cfg.faults.kill else None,
                            evaluator=evaluator)
        progress.status("building models and process groups…")
        summary = asyncio.run(orch.run())
        progress.close()
        summary.update(nodes=pool.num_nodes,
                       device_nodes=[pool.node_of[i] for i in range(pool.num_devices)])
        if evaluator is not None and evaluator.skipped:
            summary.update(eval_skipped=list(evaluator.skipped))
        if evaluator is not None and evaluator.results:  # first and last held-out accuracy
            evals = [evaluator.results[v] for v in sorted(evaluator.results)]
            summary.update(eval_accuracy_first=evals[0]["eval_accuracy"],
                           eval_accuracy_last=evals[-1]["eval_accuracy"])
        if injector.fired or orch.recovery.records:
            summary.update(num_faults=len(orch.recovery.records),
                           faults=orch.recovery.records,
                           kills=[vars(f) for f in injector.fired])
        rundir.summary(summary)
        if cfg.output.save_model and rundir.path is not None:
            _save_model(orch.versions.get(orch.versions.latest), rundir.path / "model.pt")
        return summary
    finally:
        stop_ray_evaluator(evaluator)
        rundir.close()
        if own_pool and pool is not None:
            pool.shutdown()
        elif pool is not None:
            pool.repair()  # a shared pool is whole again for the next run
        if started_ray:
            import ray

            ray.shutdown()
