"""Episodes on the builtin engine (a tiny random Qwen2 over the character tokenizer), real
clock, a tool that sleeps: the same records one episode at a time on one engine as all
episodes at once on two engines with migrations mid-turn and between turns and an engine
death; the environment stepped once per turn; engine work during tool waits."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from dynaresize.envs.base import Feedback, TurnContext, turn_rng  # noqa: E402
from dynaresize.envs.driver import EpisodeSpec, run_episodes  # noqa: E402
from dynaresize.envs.episode import contract_view, episode_record  # noqa: E402
from dynaresize.envs.render import PlainRenderer  # noqa: E402
from dynaresize.envs.serve import EngineTurns, InlineEngine, overlap_s  # noqa: E402
from dynaresize.protocols import RealClock  # noqa: E402
from dynaresize.rollout.engine import RolloutEngine  # noqa: E402
from dynaresize.tasks.base import Prompt  # noqa: E402
from dynaresize.tasks.tokenizer import CharTokenizer  # noqa: E402

TOOL_S = 0.03
KILL_AFTER = 8
TOK = CharTokenizer()


class SleepTool:
    name = "sleep_tool"
    max_turns = 3

    def __init__(self) -> None:
        self.calls: dict[tuple[int, int], int] = {}

    async def step(self, ctx: TurnContext) -> Feedback:
        self.calls[(ctx.seed, ctx.turn)] = self.calls.get((ctx.seed, ctx.turn), 0) + 1
        await asyncio.sleep(TOOL_S)
        if ctx.last_turn:
            return Feedback(done=True, reward=min(1.0, len(ctx.texts[-1]) / 8))
        return Feedback(text=str(turn_rng(ctx).randrange(100)), role="tool")


@pytest.fixture(scope="module")
def weights() -> dict:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=TOK.vocab_size, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                         max_position_embeddings=256, tie_word_embeddings=True)
    return {k: v.clone() for k, v in Qwen2ForCausalLM(config).state_dict().items()}


def engine(weights: dict, device: int) -> InlineEngine:
    torch.manual_seed(1)
    config = Qwen2Config(vocab_size=TOK.vocab_size, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                         max_position_embeddings=256, tie_word_embeddings=True)
    e = RolloutEngine(Qwen2ForCausalLM(config), eos_token_id=TOK.eos_id, device_index=device,
                      max_running=8)
    e.load_weights(weights, version=0)
    return InlineEngine(e)


def specs() -> list[EpisodeSpec]:
    return [EpisodeSpec(Prompt(p, TOK.encode_prompt(f"{p}+{p}="), "0"), step=0, sample=s,
                        version=0, run_seed=11, max_new_tokens=6)
            for p in range(3) for s in range(2)]


def run(weights: dict, num_engines: int, serial: bool, moves: list[int] | None = None):
    torch.set_num_threads(1)
    env = SleepTool()
    clock = RealClock()

    async def mover(turns: EngineTurns, done: asyncio.Event) -> None:
        # between every pair of decode iterations: move what engine 0 runs to engine 1 and
        # back; once, kill engine 1 while it holds requests (they restart on engine 0)
        i = 0
        while not done.is_set() and i < 100_000:
            await asyncio.sleep(0)
            i += 1
            src, dst = (0, 1) if i % 2 else (1, 0)
            if not turns.live[1]:
                continue
            if len(moves) == KILL_AFTER and turns.engines[1].num_running:
                moves.append(-turns.kill(1, 0))
            elif len(moves) < KILL_AFTER and turns.engines[src].num_running:
                moves.append(turns.migrate(src, dst))

    async def main():
        turns = EngineTurns([engine(weights, d) for d in range(num_engines)], clock)
        done = asyncio.Event()
        renderer = PlainRenderer(TOK)
        async with turns.serving():
            task = asyncio.create_task(mover(turns, done)) if moves is not None else None
            todo = specs()
            out = []
            for group in ([[s] for s in todo] if serial else [todo]):
                out += await run_episodes(env, group, renderer, turns, clock)
            done.set()
            if task is not None:
                await task
        return out, turns

    episodes, turns = asyncio.run(main())
    return episodes, env, turns


def records(episodes) -> list[dict]:
    return [contract_view(episode_record(ep, record_tokens=True)) for ep in episodes]


def test_episode_records_survive_migration_and_death(weights) -> None:
    base, base_env, _ = run(weights, 1, serial=True)
    moves: list[int] = []
    moved, env, turns = run(weights, 2, serial=False, moves=moves)
    assert records(moved) == records(base)
    assert set(env.calls.values()) == set(base_env.calls.values()) == {1}
    assert sum(m for m in moves if m > 0) >= KILL_AFTER  # requests moved with their prefixes
    assert moves[-1] < 0  # and an engine died holding requests
    assert all(len(ep.turns) == 3 for ep in moved)


def test_engine_decodes_while_tools_wait(weights) -> None:
    serial, _, serial_turns = run(weights, 1, serial=True)
    parallel, _, turns = run(weights, 1, serial=False)
    serial_waits = [w for ep in serial for w in ep.env_waits]
    waits = [w for ep in parallel for w in ep.env_waits]
    assert overlap_s(serial_turns.stats[0].busy, serial_waits) == 0.0
    assert overlap_s(turns.stats[0].busy, waits) > 0.0
