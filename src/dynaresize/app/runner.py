"""`dynaresize train`: place devices → start rollout → loop { generate → train → sync }.

Wires the pieces (task, device pool, orchestrator, run directory, progress) and drives the
orchestrator; owns the devices and stops every process it started, on success and on failure.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynaresize.app.progress import Progress
from dynaresize.config import Config, to_toml
from dynaresize.config.resume import check_more_steps
from dynaresize.core.allocation import Allocation
from dynaresize.core.rundir import RunDir
from dynaresize.protocols import RealClock

if TYPE_CHECKING:
    from dynaresize.orchestrator.checkpoint import CheckpointTarget


def _save_model(handle: Any, path: Path) -> None:
    import ray
    import torch

    from dynaresize.devices.weights_wire import from_wire

    torch.save(from_wire(ray.get(handle)), path)


def export_version(cfg: Config, versions: Any, run_dir: Path) -> Path:
    """`run.export_every`: the newest version's weights as RUN_DIR/export/version-V (an HF
    folder, `app.export`); written in this process, between two steps' records."""
    import ray

    from dynaresize.app.export import export_model
    from dynaresize.devices.weights_wire import from_wire

    version = versions.latest
    out = run_dir / "export" / f"version-{version:05d}"
    if not out.is_dir():
        export_model(cfg, from_wire(ray.get(versions.get(version))), out)
    return out


class RayWeightIO:
    """Full weights between a Ray object (a WeightHandle) and a file, for checkpoints."""

    @staticmethod
    def save(handle: Any, path: Path) -> None:
        _save_model(handle, path)

    @staticmethod
    def load(path: Path) -> Any:
        import ray
        import torch

        from dynaresize.devices.weights_wire import to_wire

        return ray.put(to_wire(torch.load(path, weights_only=True)))


class RunStopped(RuntimeError):
    """`stop_after_steps` ended the run early (a stand-in for a pre-emption in tests)."""


def _start_ray(cfg: Config, address: str | None, progress: Progress) -> bool:
    """Start or join the Ray cluster for `cfg`'s devices; True if this call started it."""
    from dynaresize.devices.ray_device import ensure_ray

    alloc = Allocation.initial(cfg.allocation.num_rollout_devices,
                               cfg.allocation.num_train_devices)
    address = address or cfg.ray.address
    where = f"the Ray cluster at {address}" if address else "a local Ray cluster (loopback)"
    progress.message(f"starting {cfg.num_devices} {cfg.devices.type} devices "
                     f"({alloc.describe()}) on {where}")
    return ensure_ray(address, num_cpus=max(cfg.num_devices * cfg.devices.threads_per_device, 2))


def _new_pool(cfg: Config) -> Any:
    """A DevicePool of `cfg`'s devices on the Ray cluster joined by `_start_ray`."""
    from dynaresize.devices.pool import DevicePool

    return DevicePool(cfg.num_devices, cfg.devices.type, cfg.devices.threads_per_device,
                      cfg.faults.timeout_s, cfg.ray.placement, cfg.ray.placement_timeout_s,
                      cfg.devices.gpus_per_device)


def _free_devices(evaluator: Any, pool: Any, own_pool: bool) -> Any:
    """Before the driver reads the final weights (a full copy): stop the evaluation worker
    and the device processes of a pool this run started, and wait for them to be gone, so
    that copy never adds to their memory (docs/faults.md, memory). Returns the pool left to
    release (one shared by several runs), else None."""
    from dynaresize.evaluation.worker import stop_ray_evaluator

    stop_ray_evaluator(evaluator)
    if not own_pool:
        return pool
    pool.shutdown(wait_s=SHUTDOWN_WAIT_S)
    return None


def _without_done_schedule(cfg: Config, num_done: int) -> Config:
    """A copy of `cfg` whose `[[resize.schedule]]` lacks the steps a resume already did."""
    return replace(cfg, resize=replace(
        cfg.resize, schedule=[e for e in cfg.resize.schedule if e.step >= num_done]))


def _release(pool: Any, own_pool: bool, started_ray: bool) -> None:
    """After a run: stop a pool this run started (a shared one is made whole again for the
    next run), and the Ray cluster if this run started it."""
    try:
        if own_pool and pool is not None:
            pool.shutdown()
        elif pool is not None:
            pool.repair()  # stops the hang watchdog first
    finally:  # a failed (or interrupted) pool shutdown still ends the cluster
        if started_ray:
            import ray

            ray.shutdown()


def _close(evaluator: Any, rundir: RunDir, pool: Any, own_pool: bool,
           started_ray: bool) -> None:
    """However a run ends: its evaluation worker and run directory closed, then (even if
    those fail) `_release`."""
    from dynaresize.evaluation.worker import stop_ray_evaluator

    try:
        stop_ray_evaluator(evaluator)
        rundir.close()
    finally:
        _release(pool, own_pool, started_ray)


def _checkpoints(cfg: Config, rundir: RunDir, resuming: bool) -> CheckpointTarget | None:
    """Where the run checkpoints (`run.checkpoint_every`, or a resumed run's directory), or
    None (no run directory, or neither)."""
    from dynaresize.orchestrator.checkpoint import CheckpointTarget

    if rundir.path is None or not (cfg.run.checkpoint_every or resuming):
        return None
    return CheckpointTarget(rundir.path, cfg.run.checkpoint_every, RayWeightIO())


def _speculation(devices: list[Any]) -> dict[str, Any]:
    """The run's speculative decoding (`speculation_summary`) from every live device's
    counters (a device lost to a fault is left out)."""
    from dynaresize.rollout.spec_stats import speculation_summary

    async def gather() -> list[Any]:
        return await asyncio.gather(*(d.stats() for d in devices), return_exceptions=True)

    rows = [s["rollout_counts"] for s in asyncio.run(gather()) if isinstance(s, dict)]
    return speculation_summary(rows)


def _eval_summary(evaluator: Any) -> dict[str, Any]:
    """The first and last held-out accuracy (none without evaluation results) and the
    versions whose evaluation was skipped (its worker died and did not come back)."""
    out: dict[str, Any] = {}
    if evaluator is not None and evaluator.skipped:
        out["eval_skipped"] = list(evaluator.skipped)
    if evaluator is not None and evaluator.results:
        evals = [evaluator.results[v] for v in sorted(evaluator.results)]
        out.update(eval_accuracy_first=evals[0]["eval_accuracy"],
                   eval_accuracy_last=evals[-1]["eval_accuracy"])
    return out


def _resume_point(cfg: Config, out_dir: str | Path | None, resume: bool,
                  progress: Progress) -> tuple[Config, Any]:
    """(the config to run, `read_latest`'s checkpoint or None): a resumed run continues from
    its newest complete checkpoint, without the schedule's steps already done; one stopped
    before its first checkpoint starts over from step 0."""
    from dynaresize.orchestrator.checkpoint_files import read_latest, started_without_checkpoint

    if not resume:
        return cfg, None
    if started_without_checkpoint(out_dir):
        progress.message(f"{out_dir}: no checkpoint yet: the run starts over from step 0")
        return cfg, None
    resume_from = read_latest(out_dir, progress.message)
    check_more_steps(cfg.run.steps, resume_from[1].num_steps, out_dir)  # keep the run as is
    return _without_done_schedule(cfg, resume_from[1].num_steps), resume_from


SHUTDOWN_WAIT_S = 30.0
"""After the last step, how long the driver waits for the device processes to end before it
reads the final weights."""


def _write_final_model(cfg: Config, versions: Any, run_dir: Path | None) -> None:
    """The last version's weights (`output.save_model`) and its HF export
    (`run.export_every`) in the run directory."""
    if run_dir is None:
        return
    if cfg.output.save_model:
        _save_model(versions.get(versions.latest), run_dir / "model.pt")
    if cfg.run.export_every:
        export_version(cfg, versions, run_dir)


def run_training(cfg: Config, out_dir: str | Path | None, *, address: str | None = None,
                 pool: Any = None, progress: Progress | None = None,
                 fail_op: Any = None, resume: bool = False,
                 stop_after_steps: int | None = None, chaos: Any = None) -> dict[str, Any]:
    """Run `cfg` on Ray devices; write the run directory; return summary.json's content.

    `pool`: an existing DevicePool to reuse (tests share one per session); else one is
    started for this run, on the Ray cluster at `address` (default: `ray.address`), or on a
    local Ray cluster on loopback if that is empty.
    `fail_op(resize_index, op) -> bool`: failure injection for tests.
    `resume`: continue `out_dir` from its latest checkpoint (see `checkpoint`).
    `stop_after_steps`: raise RunStopped once that many steps are done (tests).
    `chaos(devices, pool)`: called once the run's devices exist (the live chaos campaign's
    trap, `app.chaos_live`)."""
    from dynaresize.app.metric_sinks import make_sinks
    from dynaresize.devices.settings import DeviceSettings
    from dynaresize.evaluation.worker import start_ray_evaluator
    from dynaresize.orchestrator import Orchestrator
    from dynaresize.orchestrator.fault_injection import FaultInjector
    from dynaresize.tasks import make_task

    progress = progress or Progress(cfg.run.steps, cfg.output.progress)
    cfg, resume_from = _resume_point(cfg, out_dir, resume, progress)
    rundir = RunDir(out_dir, resume_step=resume_from[1].num_steps if resume_from else
                    (0 if resume else None))
    rundir.write_config(to_toml(cfg))
    started_ray = False
    own_pool = pool is None
    evaluator = None
    try:
        if own_pool:
            started_ray = _start_ray(cfg, address, progress)
            pool = _new_pool(cfg)
        rundir.place(pool.node_of)
        assert pool.num_devices == cfg.num_devices
        alloc = Allocation.initial(cfg.allocation.num_rollout_devices,
                                   cfg.allocation.num_train_devices)
        task = make_task(cfg)
        devices = pool.devices(DeviceSettings.build(cfg, task.tokenizer), alloc.roles)
        if chaos is not None:
            chaos(devices, pool)
        # issue 18: metric sinks and held-out evaluation (evaluation.worker: its own Ray actor)
        rundir.add_sinks(make_sinks(cfg, rundir.path, progress.message))
        evaluator = start_ray_evaluator(cfg, rundir.eval_result, progress.message)

        def on_step(record: dict[str, Any]) -> None:
            progress.step(record)
            every = cfg.run.export_every
            if every and rundir.path is not None and (record["step"] + 1) % every == 0:
                export_version(cfg, orch.versions, rundir.path)
            if stop_after_steps is not None and record["step"] + 1 >= stop_after_steps:
                raise RunStopped(f"stopped after {stop_after_steps} steps")

        checkpoints = _checkpoints(cfg, rundir, resume_from is not None)
        clock = RealClock()
        injector = FaultInjector(cfg.faults.kill, pool.kill, clock.now, hang=pool.hang)
        pool.watch(cfg.faults.hang_timeout_s)  # a frozen device is killed, then recovered

        orch = Orchestrator(cfg, devices, clock, task, rundir, on_step=on_step,
                            fail_op=injector.resize_hook(lambda: orch.state.step, fail_op),
                            checkpoints=checkpoints,
                            resume_from=resume_from, faults=pool,
                            injector=injector if cfg.faults.kill else None,
                            evaluator=evaluator)
        progress.status("building models and process groups…")
        summary = asyncio.run(orch.run())
        progress.close()
        summary.update(nodes=pool.num_nodes,
                       device_nodes=[pool.node_of[i] for i in range(pool.num_devices)],
                       **_eval_summary(evaluator), **injector.summary(orch.recovery.records))
        if cfg.rollout.speculative.enabled:
            summary["speculation"] = _speculation(devices)
        rundir.summary(summary)
        pool, evaluator = _free_devices(evaluator, pool, own_pool), None
        _write_final_model(cfg, orch.versions, rundir.path)
        return summary
    finally:
        _close(evaluator, rundir, pool, own_pool, started_ray)
