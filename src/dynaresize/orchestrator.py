"""The orchestrator: the RL loop over Device objects and a Clock (DESIGN §3).

```
 start devices ─► join training group
        │
        ▼
 rollout_loop  (task 1)                         train_loop  (task 2)
  for step k:                                    for step k:
    wait version v = max(0, k - s) ◄──────┐        wait samples of B_k ◄─────┐
    engines load v                        │        plan micro-batches         │
    RolloutScheduler: B_k × n requests    │        train_step on every rank   │
    rewards, advantages ─► samples[k] ────┼───────►publish_weights(k + 1) ────┘
                                          └──────── versions[k + 1]
```

- The rollout loop consumes prompt batches (seeded, a function of (seed, step)), waits for the
  policy version its step needs (staleness `s`: 0 = on-policy, 1 = one-step-off; fixed, not
  "up to s"), and produces the step's completed, rewarded samples.
- The train loop consumes a step's samples once every group is complete, waits for nothing else,
  and unblocks the rollout of step k + 1 + s by publishing version k + 1.
- Shutdown: on success both loops return after `run.steps`; on failure the first exception
  cancels the other loop, the run directory keeps every record already written, and the
  exception propagates to the caller, which owns (and stops) the devices.

The orchestrator never imports Ray or torch; SimDevice + VirtualClock run it unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dynaresize.advantages import group_advantages
from dynaresize.allocation import Allocation
from dynaresize.config import Config
from dynaresize.protocols import Clock, Device, WeightHandle
from dynaresize.rollout.scheduler import RolloutScheduler
from dynaresize.rundir import RunDir
from dynaresize.train.batching import global_num_tokens, plan_step
from dynaresize.types import Completion, RequestSpec, TrainSample, request_seed, tokens_sha256


class PromptLike(Protocol):
    id: int
    tokens: tuple[int, ...]


class PromptSource(Protocol):
    """A task as the orchestrator sees it: seeded prompt batches and a verifiable reward."""

    def batch(self, step: int, num_prompts: int, seed: int) -> Sequence[PromptLike]: ...

    def reward(self, prompt: Any, response_tokens: list[int]) -> float: ...


class VersionStore:
    """Published policy versions: version → weight handle; waiters block until published."""

    def __init__(self) -> None:
        self._handles: dict[int, WeightHandle] = {0: None}
        self._changed = asyncio.Condition()

    async def publish(self, version: int, handle: WeightHandle) -> None:
        async with self._changed:
            self._handles[version] = handle
            for old in [v for v in self._handles if v < version - 1]:
                del self._handles[old]
            self._changed.notify_all()

    async def wait(self, version: int) -> WeightHandle:
        async with self._changed:
            await self._changed.wait_for(lambda: version in self._handles)
            return self._handles[version]


@dataclass
class StepSamples:
    samples: list[TrainSample]
    reward_mean: float
    num_tokens: int
    rollout_s: float
    version: int


class Orchestrator:
    def __init__(self, cfg: Config, devices: Sequence[Device], clock: Clock,
                 source: PromptSource, rundir: RunDir,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        if len(devices) != cfg.num_devices:
            raise ValueError(f"config wants {cfg.num_devices} devices, got {len(devices)}")
        self.cfg = cfg
        self.devices = list(devices)
        self.clock = clock
        self.source = source
        self.rundir = rundir
        self.on_step = on_step or (lambda record: None)
        self.allocation = Allocation.initial(cfg.allocation.num_rollout_devices,
                                             cfg.allocation.num_train_devices)
        self.versions = VersionStore()
        self.engine_version = {d.index: 0 for d in self.devices}
        self.scheduler = RolloutScheduler(clock, cfg.rollout.max_running_requests,
                                          cfg.rollout.slice_s)
        self._samples: dict[int, asyncio.Future[StepSamples]] = {}
        self._generation = 0
        self._train_end_s: list[float] = []
        self.t_start_s = 0.0
        self.checksum: tuple[float, str] | None = None

    # ------------------------------------------------------------------ setup
    def _rollout_devices(self) -> list[Device]:
        return [self.devices[i] for i in self.allocation.rollout]

    def _train_devices(self) -> list[Device]:
        return [self.devices[i] for i in self.allocation.train]

    async def _form_train_group(self) -> None:
        members = self.allocation.train
        t0 = self.clock.now()
        await asyncio.gather(*(d.join_train_group(members, self._generation)
                               for d in self.devices))
        for i in members:
            self.rundir.event(t0, self.clock.now(), i, "join_group", critical=True)
        self._generation += 1

    def _future(self, step: int) -> asyncio.Future[StepSamples]:
        if step not in self._samples:
            self._samples[step] = asyncio.get_running_loop().create_future()
        return self._samples[step]

    # ------------------------------------------------------------------ main
    async def run(self) -> dict[str, Any]:
        t0 = self.clock.now()
        await asyncio.gather(*(d.start() for d in self.devices))
        await self._form_train_group()
        self.t_start_s = self.clock.now()
        for d in self.devices:
            self.rundir.event(t0, self.t_start_s, d.index, "start", critical=True)
        tasks = [asyncio.ensure_future(self._rollout_loop()),
                 asyncio.ensure_future(self._train_loop())]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return await self._finish()

    async def _rollout_loop(self) -> None:
        cfg = self.cfg
        for step in range(cfg.run.steps):
            version = max(0, step - cfg.run.staleness)
            handle = await self.versions.wait(version)
            await self._load_version(version, handle)
            prompts = list(self.source.batch(step, cfg.task.prompts_per_step, cfg.run.seed))
            by_id = {p.id: p for p in prompts}
            specs = [RequestSpec(step=step, prompt=p.id, sample=j, version=version,
                                 prompt_tokens=tuple(p.tokens),
                                 max_new_tokens=cfg.task.max_new_tokens,
                                 seed=request_seed(cfg.run.seed, step, p.id, j),
                                 temperature=cfg.rollout.temperature)
                     for p in prompts for j in range(cfg.task.samples_per_prompt)]
            rewards: dict[tuple[int, int], float] = {}

            def score(done: list[Completion], by_id: dict[int, Any] = by_id,
                      rewards: dict[tuple[int, int], float] = rewards) -> None:
                for c in done:
                    rewards[(c.spec.prompt, c.spec.sample)] = self.source.reward(
                        by_id[c.spec.prompt], list(c.tokens))

            t_roll = self.clock.now()
            result = await self.scheduler.run_step(self._rollout_devices(), specs, score)
            rollout_s = self.clock.now() - t_roll
            for device, (a, b) in result.busy_s.items():
                self.rundir.event(a, b, device, "rollout", critical=True, step=step)
            self._future(step).set_result(
                self._assemble(step, version, result.completions, rewards, rollout_s))

    def _assemble(self, step: int, version: int, completions: list[Completion],
                  rewards: dict[tuple[int, int], float], rollout_s: float) -> StepSamples:
        """Check DESIGN §2.1 (every sample exactly once), compute advantages, record samples."""
        by_key = {(c.spec.prompt, c.spec.sample): c for c in completions}
        expected = self.cfg.global_batch_size
        assert len(by_key) == len(completions) == expected, (
            f"step {step}: {len(completions)} completions, {len(by_key)} distinct, "
            f"expected {expected}")
        samples: list[TrainSample] = []
        records: list[dict[str, Any]] = []
        groups: dict[int, list[tuple[int, int]]] = {}
        for key in sorted(by_key):
            groups.setdefault(key[0], []).append(key)
        for keys in groups.values():
            advs = group_advantages([rewards[k] for k in keys], len(keys))
            for key, adv in zip(keys, advs):
                c = by_key[key]
                assert c.spec.version == version == c.engine_version, "policy version mismatch"
                samples.append(TrainSample(step=step, prompt=key[0], sample=key[1],
                                           prompt_tokens=list(c.spec.prompt_tokens),
                                           response_tokens=list(c.tokens),
                                           behavior_logprobs=list(c.logprobs),
                                           advantage=adv, reward=rewards[key]))
                record = {"step": step, "prompt": key[0], "sample": key[1],
                          "version": c.engine_version, "device": c.device,
                          "response_tokens": c.num_tokens,
                          "tokens_sha256": tokens_sha256(list(c.tokens)),
                          "reward": round(rewards[key], 6), "finish_reason": c.finish_reason}
                if self.cfg.output.record_tokens:
                    record["tokens"] = list(c.tokens)
                records.append(record)
        self.rundir.samples(records)
        reward_mean = sum(s.reward for s in samples) / len(samples)
        num_tokens = sum(c.num_tokens for c in completions)
        return StepSamples(samples, reward_mean, num_tokens, rollout_s, version)

    async def _load_version(self, version: int, handle: WeightHandle) -> None:
        stale = [d for d in self._rollout_devices() if self.engine_version[d.index] != version]
        if not stale:
            return
        t0 = self.clock.now()
        await asyncio.gather(*(d.load_weights(version, handle) for d in stale))
        t1 = self.clock.now()
        for d in stale:
            self.engine_version[d.index] = version
            self.rundir.event(t0, t1, d.index, "load_weights", critical=True, version=version)

    async def _train_loop(self) -> None:
        cfg = self.cfg
        prev_end_s = self.t_start_s
        for step in range(cfg.run.steps):
            got = await self._future(step)
            t0 = self.clock.now()
            trainers = self._train_devices()
            plan = plan_step(got.samples, cfg.train.micro_batch_size, len(trainers))
            global_tokens = global_num_tokens(got.samples)
            stats = await asyncio.gather(*(d.train_step(step, plan[r], global_tokens)
                                           for r, d in enumerate(trainers)))
            t1 = self.clock.now()
            handles = await asyncio.gather(*(d.publish_weights(step + 1) for d in trainers))
            t2 = self.clock.now()
            for d in trainers:
                self.rundir.event(t0, t1, d.index, "train", critical=True, step=step)
                self.rundir.event(t1, t2, d.index, "weight_sync", critical=True, step=step)
            await self.versions.publish(step + 1, handles[0])
            del self._samples[step]
            record = {
                "step": step, "reward_mean": round(got.reward_mean, 6),
                "rollout_s": round(got.rollout_s, 4), "train_s": round(t2 - t0, 4),
                "step_s": round(t2 - prev_end_s, 4),
                "num_rollout_devices": len(self.allocation.rollout),
                "num_train_devices": len(trainers), "num_resizes": 0,
                "tokens": got.num_tokens, "policy_version": got.version,
                "loss": round(float(stats[0].get("loss", 0.0)), 6),
            }
            prev_end_s = t2
            self._train_end_s.append(t2)
            self.rundir.metric(record)
            self.on_step(record)

    async def _finish(self) -> dict[str, Any]:
        trainers = self._train_devices()
        sums = await asyncio.gather(*(d.param_checksum() for d in trainers))
        param_sum, param_sha = sums[0]
        wall_s = (self._train_end_s[-1] if self._train_end_s else self.clock.now()) \
            - self.t_start_s
        metrics = self.rundir.metrics
        total_tokens = sum(m["tokens"] for m in metrics)
        num_samples = len(metrics) * self.cfg.global_batch_size
        summary = {
            "wall_s": round(wall_s, 4), "steps": len(metrics),
            "samples_per_s": round(num_samples / wall_s, 4) if wall_s > 0 else 0.0,
            "tokens_per_s": round(total_tokens / wall_s, 4) if wall_s > 0 else 0.0,
            "bubble_fraction": round(bubble_fraction(self.rundir.events, self.t_start_s,
                                                     self.t_start_s + wall_s,
                                                     len(self.devices)), 4),
            "num_resizes": 0,
            "final_reward": metrics[-1]["reward_mean"] if metrics else 0.0,
            "param_sum": param_sum, "param_sha256": param_sha,
        }
        self.rundir.summary(summary)
        return summary


BUSY_KINDS = ("rollout", "train", "weight_sync", "load_weights")


def bubble_fraction(events: list[dict[str, Any]], t0: float, t1: float,
                    num_devices: int) -> float:
    """1 − (device-seconds busy in [t0, t1]) / (num_devices × (t1 − t0))."""
    span = t1 - t0
    if span <= 0 or num_devices <= 0:
        return 0.0
    per_device: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e["kind"] in BUSY_KINDS or e["kind"].startswith("resize."):
            a, b = max(t0, e["t_start"]), min(t1, e["t_end"])
            if b > a:
                per_device.setdefault(e["device"], []).append((a, b))
    busy = 0.0
    for intervals in per_device.values():
        intervals.sort()
        cur_a, cur_b = intervals[0]
        for a, b in intervals[1:]:
            if a > cur_b:
                busy += cur_b - cur_a
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        busy += cur_b - cur_a
    return max(0.0, 1.0 - busy / (num_devices * span))
