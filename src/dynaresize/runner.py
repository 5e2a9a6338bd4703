"""`dynaresize train`: place devices → start rollout → loop { generate → train → sync }.

Wires the pieces (task, device pool, orchestrator, run directory, progress) and drives the
orchestrator; owns the devices and stops every process it started, on success and on failure.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dynaresize.allocation import Allocation
from dynaresize.config import Config, to_toml
from dynaresize.progress import Progress
from dynaresize.protocols import RealClock
from dynaresize.rundir import RunDir


def _save_model(handle: Any, path: Path) -> None:
    import ray
    import torch

    torch.save(ray.get(handle), path)


def run_training(cfg: Config, out_dir: str | Path | None, *, address: str | None = None,
                 pool: Any = None, progress: Progress | None = None,
                 fail_op: Any = None) -> dict[str, Any]:
    """Run `cfg` on Ray devices; write the run directory; return summary.json's content.

    `pool`: an existing DevicePool to reuse (tests share one per session); else one is
    started for this run (and a local Ray cluster on loopback, unless `address` is given).
    `fail_op(resize_index, op) -> bool`: failure injection for tests."""
    from dynaresize.devices.ray_device import DevicePool, ensure_ray
    from dynaresize.orchestrator import Orchestrator
    from dynaresize.tasks import make_task

    progress = progress or Progress(cfg.run.steps, cfg.output.progress)
    rundir = RunDir(out_dir)
    rundir.write_config(to_toml(cfg))
    started_ray = False
    own_pool = pool is None
    try:
        if own_pool:
            alloc = Allocation.initial(cfg.allocation.num_rollout_devices,
                                       cfg.allocation.num_train_devices)
            progress.message(f"starting {cfg.num_devices} {cfg.devices.type} devices "
                             f"({alloc.describe()}) on a local Ray cluster (loopback)")
            started_ray = ensure_ray(address, num_cpus=max(cfg.num_devices, 2))
            pool = DevicePool(cfg.num_devices, cfg.devices.type,
                              cfg.devices.threads_per_device)
        assert pool.num_devices == cfg.num_devices
        alloc = Allocation.initial(cfg.allocation.num_rollout_devices,
                                   cfg.allocation.num_train_devices)
        devices = pool.devices(cfg.to_dict(), alloc.roles)
        task = make_task(cfg)

        def on_step(record: dict[str, Any]) -> None:
            progress.step(record)

        orch = Orchestrator(cfg, devices, RealClock(), task, rundir, on_step=on_step,
                            fail_op=fail_op)
        progress.status("building models and process groups…")
        summary = asyncio.run(orch.run())
        progress.close()
        if cfg.output.save_model and rundir.path is not None:
            _save_model(orch.versions.get(orch.versions.latest), rundir.path / "model.pt")
        return summary
    finally:
        rundir.close()
        if own_pool and pool is not None:
            pool.shutdown()
        if started_ray:
            import ray

            ray.shutdown()
