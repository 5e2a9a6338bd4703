"""The episode driver in virtual time over a fake engine: context kept between turns, the
environment stepped once per turn, records independent of concurrency, migrations and deaths,
and the engine kept busy while tools wait (issue 26, acceptance 2 and 3 in miniature)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_turn_engine import EOS, FakeEngine  # noqa: E402

from dynaresize.core.types import Completion  # noqa: E402
from dynaresize.envs.base import Feedback, TurnContext, turn_rng  # noqa: E402
from dynaresize.envs.driver import (  # noqa: E402
    EpisodeSpec,
    TurnRequest,
    run_episode,
    run_episodes,
    timing_summary,
)
from dynaresize.envs.episode import context_tokens, contract_view, episode_record  # noqa: E402
from dynaresize.envs.log import EpisodeLog  # noqa: E402
from dynaresize.envs.render import PlainRenderer  # noqa: E402
from dynaresize.envs.serve import EngineTurns, overlap_s  # noqa: E402
from dynaresize.sim.clock import VirtualClock  # noqa: E402
from dynaresize.tasks.base import Prompt  # noqa: E402
from dynaresize.tasks.tokenizer import CharTokenizer  # noqa: E402

TOOL_S = 0.5
STEP_S = 0.01


class SleepyEnv:
    """A tool that takes TOOL_S and answers a seeded number; ends at the last turn with a
    reward from the texts' lengths. Counts its calls per (episode, turn)."""

    name = "sleepy"

    def __init__(self, clock: VirtualClock, max_turns: int = 3) -> None:
        self.clock = clock
        self.max_turns = max_turns
        self.calls: dict[tuple[int, int], int] = {}
        """Calls per (episode seed, turn)."""

    async def step(self, ctx: TurnContext) -> Feedback:
        key = (ctx.seed, ctx.turn)
        self.calls[key] = self.calls.get(key, 0) + 1
        await self.clock.sleep(TOOL_S)
        if ctx.last_turn:
            return Feedback(done=True, reward=(sum(map(len, ctx.texts)) % 5) / 4)
        return Feedback(text=str(turn_rng(ctx).randrange(1000)), role="tool")


def specs(num_prompts: int = 4, num_samples: int = 2) -> list[EpisodeSpec]:
    tok = CharTokenizer()
    return [EpisodeSpec(Prompt(p, tok.encode_prompt(f"q{p}"), "0"), step=3, sample=s,
                        version=0, run_seed=7, max_new_tokens=6)
            for p in range(num_prompts) for s in range(num_samples)]


def run(num_engines: int, schedule=None, in_flight: int | None = None, max_turns: int = 3):
    """Episodes in virtual time; `schedule(turns)` may migrate or kill engines mid-run;
    `in_flight`: episodes at once (None: all). Returns (episodes, env, turns, end time)."""
    clock = VirtualClock()
    env = SleepyEnv(clock, max_turns)
    renderer = PlainRenderer(CharTokenizer())

    async def main():
        engines = [FakeEngine(clock, device=i, step_s=STEP_S) for i in range(num_engines)]
        turns = EngineTurns(engines, clock)
        async with turns.serving():
            if schedule is not None:
                asyncio.get_running_loop().create_task(schedule(turns))
            todo = specs()
            width = in_flight or len(todo)
            out = []
            for i in range(0, len(todo), width):
                out += await run_episodes(env, todo[i:i + width], renderer, turns, clock)
        return out, env, turns

    episodes, env, turns = clock.run(main())
    return episodes, env, turns, clock.now()


def contract(episodes) -> list[dict]:
    return [contract_view(episode_record(ep, record_tokens=True)) for ep in episodes]


def test_context_is_kept_between_turns_and_env_stepped_once() -> None:
    episodes, env, _, _ = run(1)
    assert set(env.calls.values()) == {1}
    for ep in episodes:
        assert ep.done and len(ep.turns) == 3 and len(ep.observations) == 2
        for turn in ep.turns[1:]:
            previous = context_tokens(ep.prompt_tokens, ep.turns[:turn.turn],
                                      ep.observations[:turn.turn])
            assert turn.context_tokens == len(previous)
        assert ep.turns[0].context_tokens == len(ep.prompt_tokens)


def test_records_do_not_depend_on_engines_concurrency_migration_or_death() -> None:
    base, _, _, _ = run(1, in_flight=1)

    moved_counts: list[int] = []
    kills: list[int] = []

    async def migrate_and_kill(turns: EngineTurns) -> None:
        # every 1.5 decode iterations a move: mid-turn (requests with a prefix) and between
        # turns (the episode waits on its tool); a death half-way
        for i in range(120):
            await turns.clock.sleep(1.5 * STEP_S)
            busy_2 = turns.engines[2].num_running + turns.engines[2].num_waiting
            if i >= 60 and not kills and busy_2:
                kills.append(turns.kill(2, 0))
            elif not kills:
                moved_counts.append(turns.migrate(i % 3, (i + 1) % 3))
            else:
                moved_counts.append(turns.migrate(i % 2, (i + 1) % 2))

    moved, env, turns, _ = run(3, schedule=migrate_and_kill)
    assert contract(moved) == contract(base)
    assert set(env.calls.values()) == {1}
    assert sum(moved_counts) >= 20  # the schedule did move requests in flight
    assert kills and kills[0] > 0  # and killed an engine that held requests
    assert sum(s.turns for s in turns.stats) == 24  # each turn delivered once


def test_engine_works_while_tools_wait() -> None:
    """8 episodes of 3 turns, tools of 0.5 s: one episode at a time leaves the engine idle
    during every tool call; all in flight, the engine decodes during the tools' waits and
    the batch ends sooner."""
    serial, _, serial_turns, serial_end = run(1, in_flight=1)
    parallel, _, turns, parallel_end = run(1)
    waits = [w for ep in parallel for w in ep.env_waits]
    serial_waits = [w for ep in serial for w in ep.env_waits]
    assert overlap_s(serial_turns.stats[0].busy, serial_waits) == 0.0
    assert overlap_s(turns.stats[0].busy, waits) > 0.0
    assert parallel_end < serial_end
    # batching the episodes' turns takes fewer decode iterations than one turn at a time
    assert turns.stats[0].busy_s < serial_turns.stats[0].busy_s
    summary = timing_summary(parallel)
    assert summary["turns_per_episode"] == 3
    assert summary["env_s_p50"] == pytest.approx(TOOL_S)


def test_resume_from_log_does_not_step_the_environment_again() -> None:
    clock = VirtualClock()
    env = SleepyEnv(clock)
    renderer = PlainRenderer(CharTokenizer())
    spec = specs(1, 1)[0]

    async def main():
        engine = FakeEngine(clock, device=0)
        turns = EngineTurns([engine], clock)
        log = EpisodeLog((spec.step, spec.prompt.id, spec.sample))
        async with turns.serving():
            full = await run_episode(env, spec, renderer, turns, clock, log)
            # a crash after turn 1 was answered: resume from a copy of the log holding turns
            # 0-1 and answers 0-1; only turn 2 is generated and answered anew
            data = log.to_dict()
            data["turns"], data["answers"] = data["turns"][:2], data["answers"][:2]
            resumed_log = EpisodeLog.from_dict(data)
            env.calls.clear()
            resumed = await run_episode(env, spec, renderer, turns, clock, resumed_log)
        return full, resumed, resumed_log

    full, resumed, resumed_log = clock.run(main())
    assert contract([resumed]) == contract([full])
    assert list(env.calls.values()) == [1] and [t for _, t in env.calls] == [2]
    assert resumed_log.replayed == 2


def test_a_completion_for_another_request_is_refused() -> None:
    spec = specs(1, 1)[0]
    clock = VirtualClock()

    async def wrong(request: TurnRequest) -> Completion:
        other = replace(request.spec, prompt=request.spec.prompt + 1)
        return Completion(other, [EOS], [-0.1], "eos", device=0, engine_version=0)

    with pytest.raises(RuntimeError, match="another request"):
        clock.run(run_episode(SleepyEnv(clock), spec, PlainRenderer(CharTokenizer()), wrong,
                              clock))


class NeverEnds(SleepyEnv):
    async def step(self, ctx: TurnContext) -> Feedback:
        return Feedback(text="more", role="user")


def test_an_environment_must_end_at_the_last_turn_and_context_is_bounded() -> None:
    clock = VirtualClock()
    renderer = PlainRenderer(CharTokenizer())

    async def main(env, spec):
        turns = EngineTurns([FakeEngine(clock, device=0)], clock)
        async with turns.serving():
            return await run_episode(env, spec, renderer, turns, clock)

    with pytest.raises(RuntimeError, match="did not end episode"):
        clock.run(main(NeverEnds(clock), specs(1, 1)[0]))
    bounded = replace(specs(1, 1)[0], max_context_tokens=4)
    ep = clock.run(main(SleepyEnv(clock), bounded))
    assert ep.reward == 0.0 and ep.end_info == {"reason": "context"}
    assert len(ep.turns) == 1  # the prompt fits, the second turn's context does not


class BrokenEngine(FakeEngine):
    async def step(self):
        raise RuntimeError("engine fell over")


def test_an_engine_error_fails_the_episodes_instead_of_hanging_them() -> None:
    clock = VirtualClock()

    async def main():
        turns = EngineTurns([BrokenEngine(clock, device=0)], clock)
        with pytest.raises(RuntimeError, match="fell over"):
            async with turns.serving():
                await run_episodes(SleepyEnv(clock), specs(2, 1),
                                   PlainRenderer(CharTokenizer()), turns, clock)

    clock.run(main())


def test_overlap_counts_busy_time_inside_the_union_of_waits() -> None:
    busy = [(0.0, 2.0), (3.0, 5.0), (6.0, 7.0)]
    waits = [(1.0, 4.0), (1.5, 2.5), (10.0, 11.0)]  # overlapping waits count once
    assert overlap_s(busy, waits) == pytest.approx(1.0 + 1.0)
    assert overlap_s(busy, []) == 0.0
