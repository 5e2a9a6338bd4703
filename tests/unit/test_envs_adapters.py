"""Tools as plain functions, the tool-call parser, the tool and retry environments (with a
reasoning-gym task), and the observation renderers (plain, and a real chat template)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_checkpoint import write_tokenizer  # noqa: E402

from dynaresize.envs.adapters import RetryEnv, ToolEnv, exact_scorer, task_scorer  # noqa: E402
from dynaresize.envs.base import TurnContext  # noqa: E402
from dynaresize.envs.render import ChatRenderer, PlainRenderer  # noqa: E402
from dynaresize.envs.tools import (  # noqa: E402
    Tool,
    ToolCallError,
    calculator,
    call_tool,
    parse_tool_call,
    tools_prompt,
)
from dynaresize.tasks.base import Prompt  # noqa: E402
from dynaresize.tasks.tokenizer import CharTokenizer  # noqa: E402

CALC = {"calculator": Tool.from_function(calculator)}
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def ctx(texts: tuple[str, ...], max_turns: int = 3, prompt: Prompt | None = None
        ) -> TurnContext:
    return TurnContext(prompt or Prompt(0, (1,), "84"), 5, len(texts) - 1, max_turns, texts,
                       ())


def test_calculator_is_arithmetic_only() -> None:
    assert calculator("12*7") == "84"
    assert calculator("(1+2)/4") == "0.75"
    assert calculator("2**10 - -1") == "1025"
    for bad in ("__import__('os')", "x + 1", "2**1000"):
        with pytest.raises(ValueError):
            calculator(bad)


def test_tool_from_function_and_prompt() -> None:
    tool = CALC["calculator"]
    assert tool.parameters == ("expression",)
    assert tool.description.startswith("Evaluate an arithmetic expression")
    text = tools_prompt([tool])
    assert '"name": "calculator"' in text and "<tool_call>" in text


def test_parse_tool_call() -> None:
    text = 'let me see <tool_call>{"name": "calculator", "arguments": ' \
           '{"expression": "3*4"}}</tool_call>'
    call = parse_tool_call(text, CALC)
    assert call is not None and call.name == "calculator"
    assert call.arguments == {"expression": "3*4"}
    assert parse_tool_call("the answer is 12", CALC) is None
    for bad, match in (("<tool_call>{oops</tool_call>", "not JSON"),
                       ('<tool_call>{"name": "web"}</tool_call>', "unknown tool"),
                       ('<tool_call>{"name": "calculator", "arguments": {"x": 1}}'
                        "</tool_call>", "no parameter")):
        with pytest.raises(ToolCallError, match=match):
            parse_tool_call(bad, CALC)


def test_call_tool_reports_errors_as_text() -> None:
    from dynaresize.envs.tools import ToolCall

    async def slow_double(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    assert asyncio.run(call_tool(Tool.from_function(slow_double),
                                 ToolCall("slow_double", {"n": 4}))) == "8"
    out = asyncio.run(call_tool(CALC["calculator"], ToolCall("calculator",
                                                             {"expression": "1/0"})))
    assert out.startswith("error: ZeroDivisionError")


def test_tool_env_turns() -> None:
    env = ToolEnv([calculator], exact_scorer, max_turns=3)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
    first = asyncio.run(env.step(ctx((call,))))
    assert not first.done and first.text == "84" and first.role == "tool"
    bad = asyncio.run(env.step(ctx(("<tool_call>nope</tool_call>",))))
    assert not bad.done and bad.text.startswith("error:")
    final = asyncio.run(env.step(ctx((call, "<answer>84</answer>"))))
    assert final.done and final.reward == 1.0
    out_of_turns = asyncio.run(env.step(ctx((call, call, call))))
    assert out_of_turns.done and out_of_turns.reward == 0.0
    with pytest.raises(ValueError, match="duplicate"):
        ToolEnv([calculator, calculator], exact_scorer)


def test_retry_env_gives_a_second_try() -> None:
    env = RetryEnv(exact_scorer, max_turns=2, retry_discount=0.5)
    wrong = asyncio.run(env.step(ctx(("<answer>80</answer>",), max_turns=2)))
    assert not wrong.done and wrong.role == "user" and "Try again" in wrong.text
    right = asyncio.run(env.step(ctx(("80", "<answer>84</answer>"), max_turns=2)))
    assert right.done and right.reward == 0.5
    last = asyncio.run(env.step(ctx(("80", "81"), max_turns=2)))
    assert last.done and last.reward == 0.0
    with pytest.raises(ValueError, match="max_turns"):
        RetryEnv(exact_scorer, max_turns=0)
    again = RetryEnv(exact_scorer, feedback=lambda c: f"wrong ({c.turn + 1} tries). 80 + 4 =")
    assert asyncio.run(again.step(ctx(("80",), max_turns=2))).text == "wrong (1 tries). 80 + 4 ="


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    from dynaresize.tasks.model_tokenizer import ModelTokenizer

    path = tmp_path_factory.mktemp("chat")
    write_tokenizer(path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return ModelTokenizer(path)


def test_retry_env_on_reasoning_gym(chat_tokenizer) -> None:
    pytest.importorskip("reasoning_gym")
    from dynaresize.tasks.rgym import ReasoningGymTask

    task = ReasoningGymTask("basic_arithmetic", {"min_terms": 2, "max_terms": 2,
                                                 "min_digits": 1, "max_digits": 1,
                                                 "operators": ["+"]},
                            chat_tokenizer, fmt="chat")
    prompt = task.batch(0, 1, seed=3)[0]
    env = RetryEnv(task_scorer(task), max_turns=2)
    wrong = str(int(prompt.answer) + 1)
    first = asyncio.run(env.step(ctx((f"<answer>{wrong}</answer>",), 2, prompt)))
    assert not first.done
    second = asyncio.run(env.step(ctx((wrong, f"<answer>{prompt.answer}</answer>"), 2,
                                      prompt)))
    assert second.done and second.reward == 1.0


def test_plain_renderer() -> None:
    tok = CharTokenizer()
    r = PlainRenderer(tok)
    assert r.observation("42", "tool", True) == tuple(tok.encode(" tool: 42 "))
    assert r.observation("42", "tool", False)[0] == tok.eos_id
    assert r.decode([*tok.encode("12"), tok.eos_id, *tok.encode("9")]) == "12"


def test_chat_renderer_extends_the_stream_like_the_template(chat_tokenizer) -> None:
    r = ChatRenderer(chat_tokenizer)
    messages = [{"role": "user", "content": "What is 3*4?"}]
    turn = [*chat_tokenizer.encode("call"), chat_tokenizer.eos_id]
    stream = (*chat_tokenizer.chat(messages), *turn, *r.observation("12", "tool", True))
    full = chat_tokenizer.chat([*messages, {"role": "assistant", "content": "call"},
                                {"role": "tool", "content": "12"}])
    assert stream == full
    assert r.decode(turn) == "call"
    cut = r.observation("12", "user", False)
    assert cut[0] == chat_tokenizer.eos_id


def test_chat_renderer_refuses_a_template_that_rewrites_history(tmp_path) -> None:
    from transformers import AutoTokenizer

    from dynaresize.tasks.model_tokenizer import ModelTokenizer

    write_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    # the last message is rendered differently from the earlier ones: not append-only
    tok.chat_template = ("{% for m in messages %}{% if loop.last %}<last>{% endif %}"
                         "<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="append-only"):
        ChatRenderer(ModelTokenizer(tmp_path))
