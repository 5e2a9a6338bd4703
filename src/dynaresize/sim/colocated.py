"""The `colocated` baseline: every device rolls out, then every device trains (time-sharing,
as a hybrid engine does), simulated with the same machinery and cost model as the rest.

Per step `k` on `N` SimDevices under a `VirtualClock` (staleness is 0 by construction: the
rollout of step k needs the weights of step k - 1's update, and nothing overlaps):

1. rollout: the unchanged `RolloutRun` dispatches the step's requests over all `N` engines
   (version k); completions are assembled exactly as the orchestrator does (`assemble_step`);
2. switch to training, every device at once: `release_kv_s` + `release_weights_s` + loading
   its 1/N of the training state from host memory (`train_state_bytes(N) /
   offload_bytes_per_s`);
3. training: `SimDevice.train_step` on all N ranks (micro-batches dealt by `plan_step`), then
   `publish_weights`;
4. switch back: offloading the training state again (same bytes), loading the new weights
   (`weight_sync_s`), `alloc_kv_s + start_serving_s`.

Step 0 starts with the engines ready (as the orchestrator's does). The run writes the same
records as an orchestrator run (rollout, train, weight_sync events; the switches as
`resize.to_train` / `resize.to_rollout`, critical), so bubble fraction and report are alike.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dynaresize.config import Config, to_toml
from dynaresize.rollout.scheduler import RolloutRun
from dynaresize.rundir import RunDir
from dynaresize.samples import assemble_step
from dynaresize.sim.clock import VirtualClock
from dynaresize.sim.costs import CostModel
from dynaresize.sim.device import SimDevice, make_devices
from dynaresize.sim.harness import SimPromptSource, SimRun, no_gc
from dynaresize.timeline import bubble_fraction
from dynaresize.train.batching import plan_step
from dynaresize.types import Completion, RequestSpec, request_seed


def switch_s(costs: CostModel, num_devices: int, to_train: bool) -> float:
    """Seconds one role switch of the colocated baseline takes (module docstring, 2 and 4)."""
    r = costs.resize
    offload_s = costs.train_state_bytes(num_devices) / r.offload_bytes_per_s
    if to_train:
        return r.release_kv_s + r.release_weights_s + offload_s
    return offload_s + costs.weight_sync_s() + r.alloc_kv_s + r.start_serving_s


async def _run(cfg: Config, devices: list[SimDevice], clock: VirtualClock,
               source: SimPromptSource, rundir: RunDir, costs: CostModel) -> dict[str, Any]:
    n = len(devices)
    t_start = clock.now()
    members = tuple(range(n))
    await asyncio.gather(*(d.join_train_group(members, 0) for d in devices))
    for d in devices:
        rundir.event(t_start, clock.now(), d.index, "start", critical=True)
    t_begin = prev_end = clock.now()
    for step in range(cfg.run.steps):
        if step > 0:
            t0 = clock.now()
            await clock.sleep(switch_s(costs, n, to_train=False))
            for d in devices:
                d.version = step
                rundir.event(t0, clock.now(), d.index, "resize.to_rollout", critical=True)
        prompts = source.batch(step, cfg.task.prompts_per_step, cfg.run.seed)
        specs = [RequestSpec(step=step, prompt=p.id, sample=j, version=step,
                             prompt_tokens=p.tokens, max_new_tokens=cfg.task.max_new_tokens,
                             seed=request_seed(cfg.run.seed, step, p.id, j))
                 for p in prompts for j in range(cfg.task.samples_per_prompt)]
        rewards: dict[tuple[int, int], float] = {}

        def on_done(done: list[Completion], rewards: dict = rewards) -> None:
            for c in done:
                rewards[(c.spec.prompt, c.spec.sample)] = source.reward(None, c.tokens)

        t_roll = clock.now()
        # nobody watches progress: once the queue is empty each engine runs until it is empty
        run = RolloutRun(clock, specs, cfg.rollout.max_running_requests, cfg.rollout.slice_s,
                         on_done, drain=lambda: True)
        run.add_devices(devices)
        await run.wait()
        rollout_s = clock.now() - t_roll
        for device, (a, b) in run.busy_s.items():
            rundir.event(a, b, device, "rollout", critical=True, step=step)
        expected = {(s.prompt, s.sample) for s in specs}
        got = assemble_step(step, step, expected, run.completions, rewards, rollout_s)
        rundir.samples(got.records)
        t0 = clock.now()
        await clock.sleep(switch_s(costs, n, to_train=True))
        t1 = clock.now()
        plan = plan_step(got.samples, cfg.train.micro_batch_size, n,
                         cfg.train.max_tokens_per_micro_batch)
        # every rank's `train_step`, then `publish_weights`, charged as those calls would be
        # (all ranks start together, the step ends with the slowest), without N tasks each
        train_s = [d.train_step_s(plan[r])[0] for r, d in enumerate(devices)]
        for d, seconds in zip(devices, train_s):
            d.busy_s += seconds
        await clock.sleep(max(train_s))
        t2 = clock.now()
        for d in devices:
            d.busy_s += costs.weight_sync_latency_s
            d.version = step + 1
        await clock.sleep(costs.weight_sync_latency_s)
        t3 = clock.now()
        for d in devices:
            rundir.event(t0, t1, d.index, "resize.to_train", critical=True)
            rundir.event(t1, t2, d.index, "train", critical=True, step=step)
            rundir.event(t2, t3, d.index, "weight_sync", critical=True, step=step)
        rundir.metric({"step": step, "reward_mean": round(got.reward_mean, 6),
                       "rollout_s": round(rollout_s, 4), "train_s": round(t3 - t0, 4),
                       "step_s": round(t3 - prev_end, 4), "num_rollout_devices": n,
                       "num_train_devices": n, "num_resizes": 2 if step > 0 else 1,
                       "tokens": got.num_tokens, "policy_version": step})
        prev_end = t3
    wall_s = prev_end - t_begin
    num_samples = cfg.run.steps * cfg.global_batch_size
    total_tokens = sum(m["tokens"] for m in rundir.metrics)
    summary = {"wall_s": round(wall_s, 4), "steps": cfg.run.steps,
               "samples_per_s": round(num_samples / wall_s, 4),
               "tokens_per_s": round(total_tokens / wall_s, 4),
               "bubble_fraction": round(bubble_fraction(rundir.events, t_begin, prev_end, n), 4),
               "num_resizes": 2 * cfg.run.steps - 1, "final_reward": rundir.metrics[-1][
                   "reward_mean"], "param_sum": 0.0, "param_sha256": "sim"}
    rundir.summary(summary)
    return summary


def run_colocated(cfg: Config, workload: Any, costs: CostModel,
                  out_dir: str | Path | None = None) -> SimRun:
    """Run the colocated baseline for `cfg.run.steps` steps on `cfg.num_devices` devices
    (the allocation in `cfg` is ignored: every device does both); records as `run_config`."""
    clock = VirtualClock()
    devices = make_devices(cfg.num_devices, cfg.num_devices, costs, workload, clock)
    rundir = RunDir(out_dir)
    rundir.write_config(to_toml(cfg))
    try:
        with no_gc():
            summary = clock.run(_run(cfg, devices, clock, SimPromptSource(workload), rundir,
                                     costs))
    finally:
        rundir.close()
    return SimRun(summary, rundir)
