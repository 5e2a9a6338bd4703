"""A `verifiers` 0.4 episode end to end with our turn generator as its model Client, offline
(skipped unless verifiers is installed: it is not a project dependency; docs/agents.md).

The taskset and the harness are written here as plugin modules (verifiers loads both by
import name); the harness runs its two-turn chat loop in-process against verifiers' own
interception server on 127.0.0.1, which calls our `TurnClient`."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from dynaresize.core.types import Completion  # noqa: E402
from dynaresize.envs.base import turn_seed  # noqa: E402
from dynaresize.envs.driver import TurnRequest  # noqa: E402
from dynaresize.envs.verifiers_adapter import (  # noqa: E402
    episode_model,
    make_turn_client,
    parse_episode_model,
    plugged_client,
)

TASKSET = '''
import verifiers.v1 as vf

class AddData(vf.TaskData):
    answer: int = 0

class AddTask(vf.Task):
    @vf.reward
    async def correct(self, task, trace) -> float:
        texts = [m.content or "" for m in trace.messages if m.role == "assistant"]
        return 1.0 if texts and texts[-1].strip() == str(task.answer) else 0.0

class AddTaskset(vf.Taskset[AddTask]):
    def load(self):
        for a, b in [(2, 3), (40, 2)]:
            yield AddTask(AddData(prompt=f"What is {a}+{b}?", answer=a + b), self.config.task)

__all__ = ["AddTaskset"]
'''
HARNESS = '''
import verifiers.v1 as vf
from openai import AsyncOpenAI

class LoopConfig(vf.HarnessConfig):
    pass

class LoopHarness(vf.Harness[LoopConfig]):
    """Two turns in-process: the question, then 'Are you sure?'."""
    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kw):
        client = AsyncOpenAI(base_url=endpoint, api_key=secret)
        messages = [{"role": "user", "content": data.prompt}]
        for _ in range(2):
            reply = await client.chat.completions.create(model=ctx.model, messages=messages)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": "Are you sure?"})
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

__all__ = ["LoopHarness"]
'''


class ByteChat:
    """A byte-level tokenizer with an append-only chat template (EOS closes assistant turns)."""

    eos_id = 2

    def encode(self, text: str) -> list[int]:
        return [b + 3 for b in text.encode()]

    def decode(self, ids, skip_special: bool = True) -> str:
        return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")

    def chat(self, messages, add_generation_prompt: bool = True) -> tuple[int, ...]:
        ids: list[int] = []
        for m in messages:
            ids += self.encode(f"<{m['role']}>{m['content']}")
            if m["role"] == "assistant":
                ids.append(self.eos_id)
        return tuple(ids + (self.encode("<assistant>") if add_generation_prompt else []))


async def solve(request: TurnRequest) -> Completion:
    """A 'model' that answers the sum in the first user message, then EOS."""
    tok = ByteChat()
    question = tok.decode(request.spec.prompt_tokens).split("What is ")[1].split("?")[0]
    a, b = (int(x) for x in question.split("+"))
    tokens = [*tok.encode(str(a + b)), tok.eos_id]
    return Completion(request.spec, tokens, [-0.1] * len(tokens), "eos", device=0,
                      engine_version=request.spec.version)


@pytest.fixture
def plugins(tmp_path: Path):
    for name, source in (("dr_vf_addition", TASKSET), ("dr_vf_loop", HARNESS)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    yield
    sys.path.remove(str(tmp_path))


def test_episode_model_round_trip() -> None:
    assert parse_episode_model(episode_model(3, 14, 1)) == (3, 14, 1)
    with pytest.raises(ValueError, match="expected dynaresize"):
        parse_episode_model("gpt")


def test_a_verifiers_episode_runs_on_our_turn_generator(plugins) -> None:
    import verifiers.v1 as vf

    client = make_turn_client(solve, ByteChat(), run_seed=7, version=0, max_new_tokens=8)
    config = vf.SingleAgentEnvConfig(
        taskset=vf.TasksetConfig(id="dr_vf_addition"),
        agent=vf.AgentConfig(harness=vf.HarnessConfig(id="dr_vf_loop"),
                             runtime=vf.SubprocessConfig()))
    env = vf.SingleAgentEnv(config)
    tasks = list(env.taskset)

    async def main():
        with plugged_client(client):
            async with env.serving():
                return await asyncio.gather(*(
                    env.run_episode(task, vf.ModelContext(
                        model=episode_model(0, i, 0),
                        client=vf.EvalClientConfig(base_url="http://127.0.0.1:9/v1")))
                    for i, task in enumerate(tasks)))

    episodes = asyncio.run(main())
    assert [ep.ok for ep in episodes] == [True, True]
    assert [ep.traces[0].reward for ep in episodes] == [1.0, 1.0]
    assert sorted(client.completions) == [(0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0),
                                          (0, 1, 0, 1)]
    for (step, prompt, sample, turn), done in client.completions.items():
        assert done.spec.seed == turn_seed(7, step, prompt, sample, turn)
    assert client.bridged == 2  # each second turn's prompt extended the first exactly


def test_a_verifiers_episode_runs_on_the_builtin_engine(plugins) -> None:
    """The same episodes with a tiny random Qwen2 on our builtin engine as the model (needs
    torch next to verifiers): the turns are generated, recorded and seeded like the driver's;
    the random model's answers are wrong, so the rewards are 0."""
    torch = pytest.importorskip("torch")
    import verifiers.v1 as vf
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dynaresize.envs.serve import EngineTurns, InlineEngine
    from dynaresize.protocols import RealClock
    from dynaresize.rollout.engine import RolloutEngine

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=259, hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         intermediate_size=64, tie_word_embeddings=True))
    engine = RolloutEngine(model, eos_token_id=ByteChat.eos_id, device_index=0)
    config = vf.SingleAgentEnvConfig(
        taskset=vf.TasksetConfig(id="dr_vf_addition"),
        agent=vf.AgentConfig(harness=vf.HarnessConfig(id="dr_vf_loop"),
                             runtime=vf.SubprocessConfig()))
    env = vf.SingleAgentEnv(config)
    tasks = list(env.taskset)

    async def main():
        turns = EngineTurns([InlineEngine(engine)], RealClock())
        client = make_turn_client(turns, ByteChat(), run_seed=7, version=0, max_new_tokens=6)
        with plugged_client(client):
            async with env.serving(), turns.serving():
                episodes = await asyncio.gather(*(
                    env.run_episode(task, vf.ModelContext(
                        model=episode_model(0, i, 0),
                        client=vf.EvalClientConfig(base_url="http://127.0.0.1:9/v1")))
                    for i, task in enumerate(tasks)))
        return episodes, client, turns

    episodes, client, turns = asyncio.run(main())
    assert [ep.ok for ep in episodes] == [True, True]
    assert len(client.completions) == 4 and turns.stats[0].turns == 4
    for (step, prompt, sample, turn), done in client.completions.items():
        assert done.spec.seed == turn_seed(7, step, prompt, sample, turn)
        assert 1 <= len(done.tokens) <= 6 and done.device == 0
