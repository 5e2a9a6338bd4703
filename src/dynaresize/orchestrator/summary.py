"""summary.json of a finished run (what `dynaresize train` and `simulate` report)."""

from __future__ import annotations

import asyncio
from typing import Any

from dynaresize.core.rundir import RunDir
from dynaresize.core.timeline import bubble_fraction
from dynaresize.orchestrator.resizer import Resizer
from dynaresize.orchestrator.state import RunState
from dynaresize.protocols import Clock


async def run_summary(state: RunState, resizer: Resizer, clock: Clock, rundir: RunDir,
                      global_batch_size: int, extra: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
    """Checksums of the final weights (every trainer holds them) and the run's figures
    (and `extra`'s); written to the run directory and returned. The rates are over the
    steps this process trained (a resumed run: those after its checkpoint, whose records
    the run directory kept), the steps count all."""
    trainers = state.train_devices()
    sums = await asyncio.gather(*(d.param_checksum() for d in trainers))
    param_sum, param_sha = sums[0]
    end_s = state.train_end_s[-1] if state.train_end_s else clock.now()
    wall_s = end_s - state.t_start_s
    metrics = rundir.metrics
    trained = [m for m in metrics if m["step"] >= state.start_step]
    total_tokens = sum(m["tokens"] for m in trained)
    num_samples = len(trained) * global_batch_size
    num_resizes = sum(r.ok for r in resizer.reports)
    summary = {
        "wall_s": round(wall_s, 4), "steps": len(metrics),
        "samples_per_s": round(num_samples / wall_s, 4) if wall_s > 0 else 0.0,
        "tokens_per_s": round(total_tokens / wall_s, 4) if wall_s > 0 else 0.0,
        "bubble_fraction": round(bubble_fraction(rundir.events, state.t_start_s, end_s,
                                                 len(state.devices)), 4),
        "num_resizes": num_resizes,
        "num_failed_resizes": len(resizer.reports) - num_resizes,
        "num_skipped_resizes": len(resizer.skipped),
        "final_reward": metrics[-1]["reward_mean"] if metrics else 0.0,
        "param_sum": param_sum, "param_sha256": param_sha, **(extra or {}),
    }
    rundir.summary(summary)
    return summary
