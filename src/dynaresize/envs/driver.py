"""The episode driver: runs an episode's turns over an abstract "generate one turn" callable.

    generate: (TurnRequest) -> Awaitable[Completion]

A turn is one ordinary request (`RequestSpec`): its prompt is the episode's context so far
(envs.episode.context_tokens), its seed `turn_seed(...)`, its version the episode's (the step's
fixed version, design §2.2). Whatever serves it (envs.serve over the builtin engine, later the
rollout loop over either engine) may migrate it mid-turn like any request: the tokens depend on
(prefix, seed) only. Between turns the driver awaits the environment through the episode's
`EpisodeLog` (envs.log), which steps it at most once per turn. That await holds no engine slot:
the turn's request has finished, and the engine serves other episodes' turns meanwhile.

Timing is read from a `Clock` (real or virtual): `TurnRecord.gen_s` (submit to completion:
queueing included) and `Observation.env_s` (the environment's answer). `timing_summary` turns a
batch of episodes into the numbers the twin's `agentic` workload would be calibrated from.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dynaresize.core.types import Completion, RequestSpec
from dynaresize.envs.base import Environment, Feedback, TurnContext, episode_seed, turn_seed
from dynaresize.envs.episode import Episode, Observation, TurnRecord, context_tokens
from dynaresize.envs.log import EpisodeLog
from dynaresize.envs.render import Renderer
from dynaresize.protocols import Clock
from dynaresize.tasks.base import Prompt


@dataclass(frozen=True)
class TurnRequest:
    """One model turn of an episode: an ordinary request plus its turn index."""

    spec: RequestSpec
    turn: int

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (*self.spec.key, self.turn)


GenerateTurn = Callable[[TurnRequest], Awaitable[Completion]]


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to run: sample `sample` of `prompt` in step `step`, by version `version`."""

    prompt: Prompt
    step: int
    sample: int
    version: int
    run_seed: int
    max_new_tokens: int
    temperature: float = 1.0
    max_context_tokens: int = 0
    """End the episode (reward 0, reason 'context') before a turn whose prompt would be longer;
    0 = no bound."""


def _turn_request(spec: EpisodeSpec, turn: int, context: tuple[int, ...]) -> TurnRequest:
    seed = turn_seed(spec.run_seed, spec.step, spec.prompt.id, spec.sample, turn)
    return TurnRequest(RequestSpec(spec.step, spec.prompt.id, spec.sample, spec.version,
                                   context, spec.max_new_tokens, seed, spec.temperature), turn)


async def _model_turn(spec: EpisodeSpec, turn: int, context: tuple[int, ...],
                      generate: GenerateTurn, clock: Clock, log: EpisodeLog) -> TurnRecord:
    """Turn `turn`: from the log if it holds it (a resumed episode), else generated."""
    request = _turn_request(spec, turn, context)
    if turn < len(log.turns):
        record = log.turns[turn]
        if record.context_tokens != len(context) or record.seed != request.spec.seed:
            raise RuntimeError(f"episode {log.key} turn {turn}: the log's turn was made from "
                               "another context or seed than the replay's")
        return record
    t0 = clock.now()
    done = await generate(request)
    if done.spec.key != request.spec.key or done.spec.prompt_tokens != context:
        raise RuntimeError(f"episode {log.key} turn {turn}: got the completion of "
                           f"{done.spec.key} for another request")
    record = TurnRecord(turn, tuple(done.tokens), tuple(done.logprobs), done.engine_version,
                        done.device, done.finish_reason, request.spec.seed, len(context),
                        clock.now() - t0)
    log.add_turn(record)
    return record


async def run_episode(env: Environment, spec: EpisodeSpec, renderer: Renderer,
                      generate: GenerateTurn, clock: Clock,
                      log: EpisodeLog | None = None) -> Episode:
    """Run (or, given the log of an interrupted run, resume) one episode to its end."""
    key = (spec.step, spec.prompt.id, spec.sample)
    log = log if log is not None else EpisodeLog(key)
    if log.key != key:
        raise ValueError(f"log of episode {log.key} handed to episode {key}")
    ep = Episode(spec.step, spec.prompt.id, spec.sample, spec.version, spec.prompt.tokens)
    seed = episode_seed(spec.run_seed, spec.step, spec.prompt.id, spec.sample)
    texts: list[str] = []
    answers: list[Feedback] = []
    for turn in range(env.max_turns):
        context = context_tokens(ep.prompt_tokens, ep.turns, ep.observations)
        if spec.max_context_tokens and len(context) > spec.max_context_tokens:
            ep.reward, ep.end_info = 0.0, {"reason": "context"}
            return ep
        record = await _model_turn(spec, turn, context, generate, clock, log)
        ep.turns.append(record)
        texts.append(renderer.decode(record.tokens))
        ctx = TurnContext(spec.prompt, seed, turn, env.max_turns, tuple(texts), tuple(answers))
        t0 = clock.now()
        feedback = await log.answer(env, ctx)
        ep.env_waits.append((t0, clock.now()))
        env_s = clock.now() - t0
        answers.append(feedback)
        if feedback.done:
            ep.reward, ep.end_info = feedback.reward, dict(feedback.info)
            return ep
        if ctx.last_turn:
            raise RuntimeError(f"environment {env.name!r}: did not end episode {key} at its "
                               f"last turn ({env.max_turns} turns)")
        tokens = renderer.observation(feedback.text, feedback.role,
                                      record.finish_reason == "eos")
        ep.observations.append(Observation(turn, feedback.text, feedback.role, tokens, env_s))
    raise AssertionError("unreachable: the loop returns at the last turn")


async def run_episodes(env: Environment, specs: Sequence[EpisodeSpec], renderer: Renderer,
                       generate: GenerateTurn, clock: Clock,
                       logs: dict[tuple[int, int, int], EpisodeLog] | None = None
                       ) -> list[Episode]:
    """Run every episode concurrently (all in flight at once); results in `specs` order.
    `logs` (filled in place) keeps each episode's log, so an interrupted batch can resume."""
    logs = logs if logs is not None else {}
    for s in specs:
        logs.setdefault((s.step, s.prompt.id, s.sample), EpisodeLog((s.step, s.prompt.id,
                                                                      s.sample)))
    return list(await asyncio.gather(*(
        run_episode(env, s, renderer, generate, clock, logs[(s.step, s.prompt.id, s.sample)])
        for s in specs)))


def timing_summary(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Turns per episode, model tokens per turn, generation and environment seconds: what the
    twin's agentic workload would be calibrated from (the calibration itself is not built)."""
    turns = [t for ep in episodes for t in ep.turns]
    obs = [o for ep in episodes for o in ep.observations]
    env_s = sorted(o.env_s for o in obs)

    def quantile(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0

    return {"episodes": len(episodes),
            "turns_per_episode": len(turns) / max(1, len(episodes)),
            "tokens_per_turn": statistics.fmean(len(t.tokens) for t in turns) if turns else 0.0,
            "observation_tokens_per_turn":
                statistics.fmean(len(o.tokens) for o in obs) if obs else 0.0,
            "gen_s_total": sum(t.gen_s for t in turns),
            "env_s_total": sum(env_s),
            "env_s_p50": quantile(env_s, 0.5), "env_s_p90": quantile(env_s, 0.9)}
