"""StepEpisodes over a HeldRun with fake engines: every episode's turns go through one run,
the environment is asked once per turn, and the records do not depend on the engines."""

from __future__ import annotations

import asyncio

import pytest

from dynaresize.core.types import Completion, InflightRequest, RequestSpec, request_seed
from dynaresize.envs.adapters import RetryEnv
from dynaresize.envs.render import PlainRenderer
from dynaresize.envs.setup import EnvSetup, SlowEnv
from dynaresize.orchestrator.episodes import EpisodeTotals, StepEpisodes
from dynaresize.protocols import RealClock
from dynaresize.rollout.held_run import HeldRun
from dynaresize.rollout.run import RunSettings
from dynaresize.tasks.base import Prompt
from dynaresize.tasks.tokenizer import CharTokenizer

TOK = CharTokenizer()


class SeededEngine:
    """Tokens are a function of (prompt tokens, seed) only, one token per slice."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.running: list[InflightRequest] = []

    async def submit(self, requests: list) -> None:
        self.running += [r if isinstance(r, InflightRequest) else InflightRequest(r)
                         for r in requests]

    async def run_rollout(self, max_s: float, drain: bool = False) -> list[Completion]:
        await asyncio.sleep(0)
        done = []
        for r in list(self.running):
            spec = r.spec
            length = 2 + (spec.seed + len(spec.prompt_tokens)) % 3
            r.generated.append(TOK.eos_id if len(r.generated) + 1 == length
                               else 3 + (spec.seed + len(r.generated)) % 10)
            r.logprobs.append(-0.5)
            if len(r.generated) == length:
                self.running.remove(r)
                done.append(Completion(spec, list(r.generated), list(r.logprobs), "eos",
                                       self.index, spec.version))
        return done

    async def export_inflight(self) -> list[InflightRequest]:
        out, self.running = self.running, []
        return out


def never_right(text: str, prompt: Prompt) -> float:
    return 0.25 if text else 0.0


PROMPTS = {i: Prompt(i, (TOK.bos_id, *TOK.encode(f"q{i}")), "zz") for i in range(3)}


async def _run(num_engines: int, migrate: bool, latency_s: float = 0.0
               ) -> tuple[StepEpisodes, HeldRun]:
    clock = RealClock()
    env = RetryEnv(never_right, max_turns=3, feedback="wrong, try again.")
    setup = EnvSetup(SlowEnv(env, latency_s, clock) if latency_s else env,
                     PlainRenderer(TOK))
    episodes = StepEpisodes(setup, step=1, version=0, run_seed=7, prompts=PROMPTS,
                            samples_per_prompt=2, max_new_tokens=8, temperature=1.0,
                            clock=clock)
    requests = [RequestSpec(1, p.id, j, 0, p.tokens, 8, request_seed(7, 1, p.id, j))
                for p in PROMPTS.values() for j in range(2)]
    run = episodes.make_run(requests, RunSettings(0, 2, 0.01), episodes.receive)
    engines = [SeededEngine(i) for i in range(num_engines)]
    run.add_devices(engines)
    if migrate:
        while run.progress.num_finished < 7:  # mid-episode: some episodes are past turn 0
            await asyncio.sleep(0)
        await run.stop_admission(engines[-1])
        run.requeue(engines[-1], await engines[-1].export_inflight())
    await run.wait()
    return episodes, run


def test_every_turn_runs_in_one_held_run_and_the_env_is_asked_once_per_turn() -> None:
    episodes, run = asyncio.run(_run(2, migrate=False))
    assert run.num_open == 0 and run.progress.remaining == 0
    assert run.progress.total == 6 * 3  # three turns each (never right), all in the one run
    assert episodes.max_env_calls_per_turn == 1
    got = episodes.assemble({(p, j) for p in PROMPTS for j in range(2)}, 0.0, True, None)
    assert [r["num_turns"] for r in got.records] == [3] * 6
    for sample, record in zip(got.samples, got.records):
        assert sample.response_mask is not None
        assert sum(sample.response_mask) == record["response_tokens"]
        assert len(sample.response_tokens) > sum(sample.response_mask)  # observations
        assert sample.group_tokens > 0
    assert got.num_tokens == sum(s.num_model_tokens for s in got.samples)
    assert run.slices and all(b >= a for a, b in run.slices)


def test_records_do_not_depend_on_engines_or_a_mid_episode_migration() -> None:
    def view(got: object) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "device"}
                | {"turns": [{k: v for k, v in t.items() if k != "device"}
                             for t in r["turns"]]} for r in got.records]  # type: ignore[attr-defined]

    expected = {(p, j) for p in PROMPTS for j in range(2)}
    static, _ = asyncio.run(_run(1, migrate=False))
    moved, run = asyncio.run(_run(3, migrate=True))
    assert run.progress.num_finished == run.progress.total
    assert view(static.assemble(expected, 0.0, True, None)) == \
        view(moved.assemble(expected, 0.0, True, None))
    assert moved.max_env_calls_per_turn == 1


def test_env_time_is_measured_against_engine_slices() -> None:
    episodes, _ = asyncio.run(_run(1, migrate=False, latency_s=0.002))
    timing = episodes.env_timing()
    assert timing["env_calls"] == timing["turns"] == 18
    assert timing["env_wait_s"] > 0 and timing["env_overlap_s"] >= 0
    totals = EpisodeTotals()
    assert totals.summary() == {}  # no [env]: nothing in summary.json
    totals.add(episodes)
    summary = totals.summary()
    assert summary["env_max_calls_per_turn"] == 1 and summary["turns"] == 18
    assert summary["episode_timing"]["turns_per_episode"] == 3.0


class BrokenEnv:
    name = "broken"
    max_turns = 2

    async def step(self, ctx: object) -> object:
        raise RuntimeError("the tool crashed")


def test_an_environment_error_fails_the_run_instead_of_hanging() -> None:
    async def go() -> None:
        clock = RealClock()
        episodes = StepEpisodes(EnvSetup(BrokenEnv(), PlainRenderer(TOK)), 0, 0, 7,
                                {0: PROMPTS[0]}, 2, 8, 1.0, clock)
        requests = [RequestSpec(0, 0, j, 0, PROMPTS[0].tokens, 8, request_seed(7, 0, 0, j))
                    for j in range(2)]
        run = episodes.make_run(requests, RunSettings(0, 2, 0.01), episodes.receive)
        run.add_devices([SeededEngine(0)])
        try:
            await run.wait()
        finally:
            episodes.cancel()

    with pytest.raises(RuntimeError, match="the tool crashed"):
        asyncio.run(go())


def test_held_run_refuses_tail_ordering() -> None:
    with pytest.raises(ValueError, match="tail ordering"):
        HeldRun(RealClock(), [], RunSettings(0, 2, 0.01, tail_order=True), lambda done: None,
                num_episodes=1)
