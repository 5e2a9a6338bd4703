"""One step's episodes in the live rollout (`[env]`, docs/agents.md): `StepEpisodes`.

Each (prompt, sample) of the step is an episode run by `envs.driver.run_episode`, its turns
served by the step's `HeldRun` (rollout/held_run.py):

* turn 0 of every episode is the step's ordinary request (`StepRollout.specs`: the same
  spec, since `turn_seed(..., 0)` is the request seed), in the run from its start;
* when a turn's request completes, its episode asks the environment through its `EpisodeLog`
  (at most one call per turn) off the engines, which serve other requests meanwhile, then
  submits the next turn (prompt = the episode's context so far, seed `turn_seed`, the step's
  version) to the same run;
* an episode that ends closes its hold on the run; the run ends with the last one.

A turn may migrate mid-turn or rerun from scratch after a device death like any request: its
tokens depend on (prompt, seed) only, and the episode waits for its one completion. `assemble`
turns the finished episodes into the step's samples (response mask on model tokens, GRPO
advantages over each prompt's episodes) and one record per episode (`envs.episode`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from dynaresize.core.advantages import AdvantageSpec, spec_advantages
from dynaresize.core.samples import StepSamples
from dynaresize.core.types import Completion, RequestSpec
from dynaresize.envs.driver import EpisodeSpec, TurnRequest, run_episode, timing_summary
from dynaresize.envs.episode import Episode, episode_record
from dynaresize.envs.log import EpisodeLog
from dynaresize.envs.serve import overlap_s
from dynaresize.envs.setup import EnvSetup
from dynaresize.envs.train_view import episode_samples
from dynaresize.protocols import Clock, RolloutOps
from dynaresize.rollout.held_run import HeldRun
from dynaresize.rollout.run_settings import RunSettings
from dynaresize.tasks.base import Prompt


class StepEpisodes:
    """Step `step`'s episodes over one `HeldRun` (module docstring)."""

    def __init__(self, setup: EnvSetup, step: int, version: int, run_seed: int,
                 prompts: Mapping[int, Any], samples_per_prompt: int, max_new_tokens: int,
                 temperature: float, clock: Clock) -> None:
        self.setup = setup
        self.step = step
        self.version = version
        self.clock = clock
        self.specs = [EpisodeSpec(prompt, step, j, version, run_seed, max_new_tokens,
                                  temperature, setup.max_context_tokens)
                      for prompt in prompts.values() for j in range(samples_per_prompt)]
        self.logs = {(step, s.prompt.id, s.sample): EpisodeLog((step, s.prompt.id, s.sample))
                     for s in self.specs}
        self.episodes: dict[tuple[int, int], Episode] = {}
        self.run: HeldRun | None = None
        self._waiting: dict[tuple[int, int, int], asyncio.Future[Completion]] = {}
        self._arrived: dict[tuple[int, int, int], Completion] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def make_run(self, requests: list[RequestSpec], settings: RunSettings,
                 on_completions: Callable[[list[Completion]], None],
                 on_device_lost: Callable[[RolloutOps, BaseException], bool] | None = None
                 ) -> HeldRun:
        """The step's run (turn-0 requests `requests`), with every episode started on it."""
        settings = dataclasses.replace(settings, tail_order=False, spread=False)
        run = self.run = HeldRun(self.clock, requests, settings, on_completions,
                                 len(self.specs), on_device_lost)
        self._tasks = [asyncio.ensure_future(self._episode(s)) for s in self.specs]
        return run

    def receive(self, done: list[Completion]) -> None:
        """Finished turns, from the run: each to the episode waiting for it."""
        for c in done:
            future = self._waiting.pop(c.spec.key, None)
            if future is not None and not future.done():
                future.set_result(c)
            else:  # its episode has not asked yet (turn 0 of an episode just started)
                self._arrived[c.spec.key] = c

    async def _generate(self, request: TurnRequest) -> Completion:
        run, key = self.run, request.spec.key
        assert run is not None
        if request.turn > 0:
            run.submit([request.spec])
        ready = self._arrived.pop(key, None)
        if ready is not None:
            return ready
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        return await future

    async def _episode(self, spec: EpisodeSpec) -> None:
        run = self.run
        assert run is not None
        key = (self.step, spec.prompt.id, spec.sample)
        try:
            prompt = spec.prompt
            if not isinstance(prompt, Prompt):
                raise TypeError(f"episode {key}: the task's prompts must be tasks.base.Prompt")
            episode = await run_episode(self.setup.env, spec, self.setup.renderer,
                                        self._generate, self.clock, self.logs[key])
        except Exception as exc:  # the run fails with it (wait() raises it)
            run.fail(exc)
            return
        self.episodes[(spec.prompt.id, spec.sample)] = episode
        run.close_episode()

    def cancel(self) -> None:
        """Stop the episodes still waiting (the run failed)."""
        for task in self._tasks:
            task.cancel()
        for future in self._waiting.values():
            future.cancel()

    @property
    def max_env_calls_per_turn(self) -> int:
        """The contract's check: at most 1 environment call for any turn of any episode."""
        return max((log.max_env_calls_per_turn for log in self.logs.values()), default=0)

    def env_timing(self) -> dict[str, float]:
        """Environment wait seconds (union of every episode's waits) and the engine seconds
        spent inside them (`overlap_s` of the run's slices)."""
        waits = [w for ep in self.episodes.values() for w in ep.env_waits]
        busy = self.run.slices if self.run is not None else []
        return {"env_wait_s": _union_s(waits),
                "env_overlap_s": overlap_s(busy, waits),
                "env_calls": float(sum(sum(log.env_calls.values())
                                       for log in self.logs.values())),
                "turns": float(sum(len(ep.turns) for ep in self.episodes.values()))}

    def assemble(self, expected: set[tuple[int, int]], rollout_s: float, record_tokens: bool,
                 adv_spec: AdvantageSpec | None) -> StepSamples:
        """The step's samples (one per episode, (prompt, sample) order) and records."""
        episodes = list(self.episodes.values())
        samples = episode_samples(self.step, self.version, expected, episodes)
        by_key = {(ep.prompt, ep.sample): ep for ep in episodes}
        start = 0
        while start < len(samples):  # advantages and group tokens per prompt group
            stop = start
            while stop < len(samples) and samples[stop].prompt == samples[start].prompt:
                stop += 1
            group = samples[start:stop]
            lengths = [s.num_model_tokens for s in group]
            advs = spec_advantages([s.reward for s in group], lengths, adv_spec)
            for s, adv in zip(group, advs):
                s.advantage, s.group_tokens = adv, sum(lengths)
            start = stop
        records = [episode_record(by_key[(s.prompt, s.sample)], record_tokens)
                   for s in samples]
        num_tokens = sum(s.num_model_tokens for s in samples)
        reward_mean = sum(s.reward for s in samples) / max(1, len(samples))
        return StepSamples(list(samples), records, reward_mean, num_tokens, rollout_s,
                           self.version)


def _union_s(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of `intervals`."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total



class EpisodeTotals:
    """A run's episode figures over its steps (summary.json; empty without `[env]`)."""

    def __init__(self) -> None:
        self.env_timing: dict[str, float] = {}
        self.max_env_calls_per_turn = 0
        self.episodes: list[Episode] = []

    def add(self, step: StepEpisodes) -> None:
        """A step's finished episodes."""
        for key, value in step.env_timing().items():
            self.env_timing[key] = self.env_timing.get(key, 0.0) + value
        self.max_env_calls_per_turn = max(self.max_env_calls_per_turn,
                                          step.max_env_calls_per_turn)
        self.episodes.extend(step.episodes.values())

    def summary(self) -> dict[str, Any]:
        """Environment wait seconds, engine seconds busy inside them, environment calls and
        turns, the contract's check (at most 1 environment call per turn), and
        `envs.driver.timing_summary` of every episode (what the twin's agentic workload
        would be calibrated from). Empty if no episode ran."""
        if not self.episodes:
            return {}
        out: dict[str, Any] = {k: round(v, 4) for k, v in self.env_timing.items()}
        out["env_max_calls_per_turn"] = self.max_env_calls_per_turn
        out["episode_timing"] = {k: round(v, 4) for k, v in
                                 timing_summary(self.episodes).items()}
        return out
