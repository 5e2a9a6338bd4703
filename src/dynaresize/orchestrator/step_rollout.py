"""One step's rollout, with one owner: `StepRollout`.

A request's path through it, in order: `StepRollout` makes the step's prompts into request
specs (`requests`), the `RolloutRun` it was started with runs them on the engines and hands
each batch of completions back (`receive`: the reward of every completion, the streamed
micro-batches); then the rollout loop's watchers see the progress (fault kills, controller
moves, whose resizes the step keeps in `fired`); once the run ended,
`assemble` turns the completions and rewards into the step's samples and records.

The policy version a step samples from is `RolloutSettings.version_for(step)`, nowhere else.
A step's prompt set is `prompts`. With dynamic sampling the step gets its prompt stream, of
which it dispatches the first ones up front and, each time a group without a reward signal
finishes, one more (`_top_up`, planned by `core.dynamic_sampling.TopUp`): `add_prompts`
grows `prompts` and the new requests join the running `RolloutRun` (`add_requests`). With
`[env]` every sample is an episode: `episodes` (`orchestrator.episodes.StepEpisodes`) builds
the run, takes the completions and assembles.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dynaresize.config import Config
from dynaresize.core.advantages import AdvantageSpec, advantage_spec
from dynaresize.core.dynamic_sampling import (
    DynamicSampling,
    TopUp,
    assemble_dynamic,
    has_signal,
)
from dynaresize.core.samples import StepSamples, assemble_step
from dynaresize.core.stream import StepStream
from dynaresize.core.types import Completion, RequestSpec, request_seed
from dynaresize.envs.setup import EnvSetup
from dynaresize.orchestrator.episodes import StepEpisodes
from dynaresize.orchestrator.source import PromptLike, PromptSource
from dynaresize.orchestrator.state import sample_version
from dynaresize.protocols import Clock
from dynaresize.rollout.run import RolloutRun


@dataclass(frozen=True)
class RolloutSettings:
    """What the rollout side reads of the config (`from_config`), frozen."""

    steps: int
    staleness: int
    seed: int
    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    temperature: float
    micro_batch_size: int
    max_tokens_per_micro_batch: int
    max_running_requests: int
    slice_s: float
    tail_batch: int
    pack_batch: int
    tail_policy: str
    record_tokens: bool
    streaming: bool = False
    """Training streams over completed groups: completions go to a `StepStream`."""
    pipelined: bool = False
    """Step k + 1's rollout starts on the engines step k's tail has emptied
    (`orchestrator.rollout_loop`)."""
    adv_spec: AdvantageSpec | None = None
    """How rewards become advantages (`train.loss`; None: GRPO's)."""
    dynamic: DynamicSampling | None = None
    """`[train.dynamic_sampling]` when enabled: the step's prompts come from a seeded
    stream, topped up live, and only the kept groups train (`core.dynamic_sampling`)."""
    env: EnvSetup | None = None
    """`[env]` on: every sample is an episode (`orchestrator.episodes`)."""

    @classmethod
    def from_config(cls, cfg: Config, streaming: bool = False, pipelined: bool = False,
                    env: EnvSetup | None = None) -> RolloutSettings:
        ds = cfg.train.dynamic_sampling
        dynamic = DynamicSampling(cfg.task.prompts_per_step, ds.max_rounds, ds.margin) \
            if ds.enabled else None
        return cls(streaming=streaming, pipelined=pipelined, dynamic=dynamic, env=env,
                   adv_spec=advantage_spec(cfg.train.loss, cfg.task.max_new_tokens),
                   steps=cfg.run.steps, staleness=cfg.run.staleness, seed=cfg.run.seed,
                   prompts_per_step=cfg.task.prompts_per_step,
                   samples_per_prompt=cfg.task.samples_per_prompt,
                   max_new_tokens=cfg.task.max_new_tokens,
                   temperature=cfg.rollout.temperature,
                   micro_batch_size=cfg.train.micro_batch_size,
                   max_tokens_per_micro_batch=cfg.train.max_tokens_per_micro_batch,
                   max_running_requests=cfg.rollout.max_running_requests,
                   slice_s=cfg.rollout.slice_s,
                   tail_batch=cfg.controller.hysteresis.tail_batch,
                   pack_batch=cfg.rollout.pack_batch, tail_policy=cfg.rollout.tail_policy,
                   record_tokens=cfg.output.record_tokens)

    def version_for(self, step: int) -> int:
        """The policy version step `step` samples from: max(0, step - staleness)
        (`orchestrator.state.sample_version`)."""
        return sample_version(step, self.staleness)


class StepRollout:
    """Step `step`'s rollout (module docstring). Written only through its own methods."""

    def __init__(self, step: int, settings: RolloutSettings, prompts: Sequence[PromptLike],
                 source: PromptSource, clock: Clock, changed: asyncio.Event,
                 watch: Callable[[StepRollout], None], num_initial: int = 0) -> None:
        """`prompts`: the step's batch or, with dynamic sampling, its prompt stream, of which
        the first `num_initial` are dispatched up front; `changed`: set when streamed
        micro-batches become ready (the train loop looks); `watch(self)`: the rollout loop's
        watchers, after every batch of completions."""
        self.step = step
        self.version = settings.version_for(step)
        self.settings = settings
        self.source = source
        self.clock = clock
        self.pool: dict[int, PromptLike] = {p.id: p for p in prompts}
        self.top_up: TopUp | None = None
        if settings.dynamic is not None:
            self.top_up = TopUp(list(self.pool), settings.prompts_per_step, num_initial)
            prompts = [self.pool[p] for p in self.top_up.first()]
        self.prompts: dict[int, PromptLike] = {p.id: p for p in prompts}
        self.specs: list[RequestSpec] = self.requests(prompts)
        self.rewards: dict[tuple[int, int], float] = {}
        self.changed = changed
        self.watch = watch
        self.stream: StepStream | None = None
        if settings.streaming:
            self.stream = StepStream(step, self.version, list(self.pool),
                                     settings.samples_per_prompt, settings.micro_batch_size,
                                     settings.max_tokens_per_micro_batch, settings.adv_spec,
                                     settings.prompts_per_step if settings.dynamic else 0)
            if self.top_up is not None:
                self.stream.grow(len(self.prompts))
        self.fired: list[asyncio.Future[Any]] = []
        """Resizes the step's moves started (the rollout end waits for them)."""
        self.run: RolloutRun | None = None
        self.started_s = 0.0
        self.filter_rate: float | None = None
        """Dynamic sampling: the share of the step's groups without a reward signal (known
        once `assemble` ran)."""
        self.episodes: StepEpisodes | None = None if settings.env is None else StepEpisodes(
            settings.env, step, self.version, settings.seed, self.prompts,
            settings.samples_per_prompt, settings.max_new_tokens, settings.temperature, clock)
        """`[env]`: the step's episodes; `specs` are their first turns."""

    def requests(self, prompts: Sequence[PromptLike]) -> list[RequestSpec]:
        """The request specs of `prompts`: `samples_per_prompt` each, seeded by
        (seed, step, prompt, sample), all of the step's version."""
        s = self.settings
        return [RequestSpec(step=self.step, prompt=p.id, sample=j, version=self.version,
                            prompt_tokens=tuple(p.tokens), max_new_tokens=s.max_new_tokens,
                            seed=request_seed(s.seed, self.step, p.id, j),
                            temperature=s.temperature)
                for p in prompts for j in range(s.samples_per_prompt)]

    def add_prompts(self, prompts: Sequence[PromptLike]) -> list[RequestSpec]:
        """More prompts for this step (dynamic sampling's top-up); returns their requests,
        which the caller hands to the running `RolloutRun`."""
        new = [p for p in prompts if p.id not in self.prompts]
        self.prompts.update((p.id, p) for p in new)
        specs = self.requests(new)
        self.specs.extend(specs)
        return specs

    def expected(self) -> set[tuple[int, int]]:
        """Every (prompt, sample) the step's samples must hold."""
        n = self.settings.samples_per_prompt
        return {(p, j) for p in self.prompts for j in range(n)}

    def start(self, make_run: Callable[[StepRollout], RolloutRun]) -> RolloutRun:
        """Start the step's run (`make_run(self)` builds it complete, `receive` as its
        completion stream): from now on the rollout's time counts."""
        self.started_s = self.clock.now()
        self.run = make_run(self)
        return self.run

    def receive(self, done: list[Completion]) -> None:
        """The run's completion stream: reward each completion, add it to the step's
        stream (`changed` is set when micro-batches become ready), then let the watchers see
        the progress. Episodes: each finished turn goes to its episode."""
        if self.episodes is not None:
            self.episodes.receive(done)
            self.watch(self)
            return
        stream = self.stream
        for c in done:
            key = (c.spec.prompt, c.spec.sample)
            reward = self.rewards[key] = self.source.reward(self.prompts[c.spec.prompt],
                                                            list(c.tokens))
            # (dynamic sampling: the last group may release nothing, yet completes it)
            if stream is not None and (stream.add(c, reward, self.clock.now())
                                       or stream.complete):
                self.changed.set()
            if self.top_up is not None:
                self._top_up(c.spec.prompt)
        self.watch(self)

    def _top_up(self, prompt: int) -> None:
        """Dynamic sampling, after a completion of `prompt`: once its group is complete,
        dispatch what `TopUp` asks for; once every dispatched group is, seal the stream."""
        top_up, n = self.top_up, self.settings.samples_per_prompt
        assert top_up is not None and self.run is not None
        keys = [(prompt, j) for j in range(n)]
        if any(k not in self.rewards for k in keys):
            return
        new = top_up.complete(prompt, has_signal([self.rewards[k] for k in keys]))
        if new:
            specs = self.add_prompts([self.pool[p] for p in new])
            if self.stream is not None:
                self.stream.grow(len(new))
            self.run.add_requests(specs)
        elif top_up.done and self.stream is not None:
            self.stream.seal(top_up.batch_size(), self.clock.now())
            self.changed.set()

    def fire(self, resize: asyncio.Future[Any]) -> None:
        """A resize the step's moves started."""
        self.fired.append(resize)

    def progress(self) -> float:
        """The share of the run's requests finished."""
        assert self.run is not None
        return self.run.progress.num_finished / self.run.progress.total

    def assemble(self) -> StepSamples:
        """The ended run's samples and records (raises if one is missing or extra)."""
        run = self.run
        assert run is not None
        end_s = self.clock.now()
        stream, s = self.stream, self.settings
        if self.episodes is not None:
            got = self.episodes.assemble(self.expected(), end_s - self.started_s,
                                         s.record_tokens, s.adv_spec)
        elif self.top_up is not None:  # the kept groups train; the batch's groups are recorded
            batch = self.top_up.batch()
            inside = set(batch)
            got, self.filter_rate = assemble_dynamic(
                self.step, self.version, batch,
                [c for c in run.progress.completions if c.spec.prompt in inside],
                {k: r for k, r in self.rewards.items() if k[0] in inside},
                s.samples_per_prompt, s.prompts_per_step, end_s - self.started_s,
                s.record_tokens, s.adv_spec)
        else:
            got = assemble_step(self.step, self.version, self.expected(), run.progress.completions,
                                self.rewards, end_s - self.started_s, s.record_tokens,
                                stream.samples if stream is not None else None, s.adv_spec)
        return dataclasses.replace(
            got, rollout_device_s=sum(b - a for a, b in run.progress.busy_s.values()),
            rollout_tail_device_s=run.progress.tail_device_s(),
            tail_tokens_per_s=run.progress.lives.tail_tokens_per_s(),
            ready_profile=stream.ready_profile(self.started_s, self.clock.now())
            if stream is not None else ())

    async def settle_moves(self) -> None:
        """Wait for the resizes fired so far (their errors surface in `finish_moves`)."""
        pending = [f for f in self.fired if not f.done()]
        if pending:
            await asyncio.wait(pending)

    async def finish_moves(self) -> None:
        """Wait for every resize the step fired; raise the first error."""
        await asyncio.gather(*self.fired)
