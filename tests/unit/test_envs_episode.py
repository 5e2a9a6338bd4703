"""The episode data model (pure): seeds, the token stream and its loss mask, the record, the
episode log's one-step-per-turn rule, GRPO groups over episodes and the packed mask."""

from __future__ import annotations

import asyncio
import json

import pytest

from dynaresize.core.types import request_seed, tokens_sha256
from dynaresize.envs.base import Feedback, TurnContext, episode_seed, turn_rng, turn_seed
from dynaresize.envs.episode import (
    Episode,
    Observation,
    TurnRecord,
    context_tokens,
    contract_view,
    episode_record,
    flatten,
)
from dynaresize.envs.log import EpisodeLog, ReplayDiverged
from dynaresize.envs.train_view import episode_samples, masked_num_tokens, pack_episodes
from dynaresize.tasks.base import Prompt


def turn(i: int, tokens: tuple[int, ...], version: int = 0, device: int = 0,
         context: int = 0) -> TurnRecord:
    return TurnRecord(i, tokens, tuple(-0.1 * (k + 1) for k in range(len(tokens))), version,
                      device, "eos", turn_seed(1, 0, 0, 0, i), context)


def episode(prompt: int = 0, sample: int = 0, reward: float = 1.0, version: int = 0,
            device: int = 0) -> Episode:
    ep = Episode(0, prompt, sample, version, (1, 5, 6))
    ep.turns = [turn(0, (10, 11, 2), version, device, 3),
                turn(1, (12, 2), version, device, 9)]
    ep.observations = [Observation(0, "42", "tool", (20, 21, 22))]
    ep.reward = reward
    return ep


def test_seeds_depend_on_the_episode_only() -> None:
    assert turn_seed(7, 1, 2, 3, 0) == request_seed(7, 1, 2, 3)  # one turn = single-turn
    seeds = {turn_seed(7, 1, 2, 3, t) for t in range(5)} | {episode_seed(7, 1, 2, 3)}
    assert len(seeds) == 6
    assert episode_seed(7, 1, 2, 3) != episode_seed(7, 1, 2, 4)
    ctx = TurnContext(Prompt(0, (1,), "a"), episode_seed(7, 1, 2, 3), 1, 3, ("x", "y"), ())
    assert turn_rng(ctx).random() == turn_rng(ctx).random()
    with pytest.raises(ValueError, match="turn = -1"):
        turn_seed(7, 1, 2, 3, -1)


def test_feedback_validates_role_and_reward() -> None:
    with pytest.raises(ValueError, match="role"):
        Feedback(text="x", role="system")
    with pytest.raises(ValueError, match="reward"):
        Feedback(done=True, reward=1.5)


def test_stream_mask_and_record() -> None:
    ep = episode()
    assert context_tokens(ep.prompt_tokens, ep.turns[:1], ep.observations) == \
        (1, 5, 6, 10, 11, 2, 20, 21, 22)
    tokens, mask, logprobs = flatten(ep)
    assert tokens == [10, 11, 2, 20, 21, 22, 12, 2]
    assert mask == [1, 1, 1, 0, 0, 0, 1, 1]
    assert [lp for lp, m in zip(logprobs, mask) if not m] == [0.0, 0.0, 0.0]
    record = episode_record(ep, record_tokens=True)
    assert record["response_tokens"] == 5 and record["num_turns"] == 2
    assert record["tokens_sha256"] == tokens_sha256(tokens)
    assert record["turns"][1]["tokens_sha256"] == tokens_sha256([12, 2])
    assert record["observations"] == [{"role": "tool", "text": "42", "tokens": 3}]
    json.dumps(record)
    moved = episode(device=3)
    assert episode_record(moved) != episode_record(ep)
    assert contract_view(episode_record(moved)) == contract_view(episode_record(ep))


def test_unfinished_episode_has_no_record() -> None:
    ep = episode()
    ep.reward = None
    with pytest.raises(ValueError, match="not finished"):
        episode_record(ep)


class CountingEnv:
    name = "count"
    max_turns = 3

    def __init__(self) -> None:
        self.calls = 0

    async def step(self, ctx: TurnContext) -> Feedback:
        self.calls += 1
        return Feedback(text=f"n{turn_rng(ctx).randrange(10)}")


def ctx(turn_index: int, texts: tuple[str, ...]) -> TurnContext:
    return TurnContext(Prompt(0, (1,), "a"), 99, turn_index, 3, texts, ())


def test_log_steps_the_environment_once_per_turn_and_replays() -> None:
    env = CountingEnv()
    log = EpisodeLog((0, 0, 0))

    async def go():
        first = await log.answer(env, ctx(0, ("a",)))
        again = await log.answer(env, ctx(0, ("a",)))
        second = await log.answer(env, ctx(1, ("a", "b")))
        return first, again, second

    first, again, second = asyncio.run(go())
    assert first == again and env.calls == 2 and log.replayed == 1
    assert log.max_env_calls_per_turn == 1
    restored = EpisodeLog.from_dict(json.loads(json.dumps(log.to_dict())))
    assert asyncio.run(restored.answer(env, ctx(1, ("a", "b")))) == second
    assert env.calls == 2
    with pytest.raises(ReplayDiverged):
        asyncio.run(restored.answer(env, ctx(1, ("a", "c"))))
    with pytest.raises(ValueError, match="asked before"):
        asyncio.run(EpisodeLog((0, 0, 0)).answer(env, ctx(1, ("a", "b"))))
    with pytest.raises(ValueError, match="in order"):
        EpisodeLog((0, 0, 0)).add_turn(turn(1, (3,)))


def test_grpo_groups_over_episodes() -> None:
    eps = [episode(p, s, reward=r) for p, rs in ((0, (1.0, 0.0)), (1, (0.5, 0.5)))
           for s, r in enumerate(rs)]
    samples = episode_samples(0, 0, {(0, 0), (0, 1), (1, 0), (1, 1)}, eps[::-1])
    assert [(s.prompt, s.sample) for s in samples] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert samples[0].advantage > 0 > samples[1].advantage
    assert samples[2].advantage == samples[3].advantage == 0.0
    assert samples[0].response_mask == [1, 1, 1, 0, 0, 0, 1, 1]
    assert masked_num_tokens(samples) == 4 * 5
    with pytest.raises(RuntimeError, match="missing"):
        episode_samples(0, 0, {(0, 0), (0, 1), (2, 0)}, eps[:2])
    with pytest.raises(RuntimeError, match="version"):
        episode_samples(0, 1, {(0, 0)}, [eps[0]])


def test_pack_masks_environment_tokens() -> None:
    pytest.importorskip("torch")
    samples = episode_samples(0, 0, {(0, 0), (0, 1)},
                              [episode(0, 0, 1.0), episode(0, 1, 0.0)])
    batch = pack_episodes(samples)
    prompt = 3
    # target position j scores token j + 1: response token i is scored at prompt - 1 + i
    row = batch.loss_mask[0].tolist()
    assert row[prompt - 1:prompt - 1 + 8] == [True, True, True, False, False, False, True,
                                               True]
    assert batch.num_tokens == masked_num_tokens(samples) == 10
    assert batch.advantages[0][prompt - 1 + 3:prompt - 1 + 6].abs().sum() == 0
    assert batch.targets[0, prompt - 1 + 3] == 20  # the first observation token, masked
