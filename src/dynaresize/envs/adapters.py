"""Environments built from the project's own pieces: a tool-calling environment over plain
Python functions, and a "try again" environment over any text task (reasoning-gym, math).

Both are pure functions of the `TurnContext` (no state between calls), so a replayed turn gets
the same answer (envs.base). The reward is the task's own score of the final answer.

* `ToolEnv`: a turn with a `<tool_call>` gets the tool's result as a `tool` message (a
  malformed call gets the parse error, so the model can correct it); a turn without one is the
  final answer and ends the episode. The last allowed turn always ends it: a tool call there
  scores 0 (`info["reason"] = "turns"`).
* `RetryEnv`: every turn is an attempt; a full score (or the last allowed turn) ends the
  episode, a wrong answer gets `feedback` as a `user` message (a string, or a function of the
  `TurnContext`, e.g. to repeat the question for completion prompts). The reward of a success at
  turn t is `score * retry_discount ** t` (1.0 = a second try is worth as much as a first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dynaresize.envs.base import Feedback, TurnContext, check_max_turns
from dynaresize.envs.tools import Tool, ToolCallError, call_tool, parse_tool_call
from dynaresize.tasks.base import Prompt
from dynaresize.tasks.text import TextTask, extract_answer

Scorer = Callable[[str, Prompt], float]
"""(a model turn's text, the prompt) → score in [0, 1]."""


def task_scorer(task: TextTask) -> Scorer:
    """A text task's reward on decoded text: its answer extraction, then its `score`."""

    def score(text: str, prompt: Prompt) -> float:
        answer = extract_answer(text, task.format)
        if not answer:
            return 0.0
        return min(1.0, max(0.0, float(task.score(answer, prompt))))

    return score


def exact_scorer(text: str, prompt: Prompt) -> float:
    """1.0 if the text inside the last `<answer>…</answer>` (else the whole text) equals the
    prompt's reference answer, else 0.0."""
    return 1.0 if extract_answer(text, "chat") == prompt.answer.strip() else 0.0


class ToolEnv:
    """Tool calling over plain Python functions (see module docstring)."""

    name = "tools"

    def __init__(self, tools: Sequence[Callable[..., Any] | Tool], scorer: Scorer,
                 max_turns: int = 4) -> None:
        built = [t if isinstance(t, Tool) else Tool.from_function(t) for t in tools]
        self.tools = {t.name: t for t in built}
        if len(self.tools) != len(built):
            raise ValueError(f"tools: duplicate names in {[t.name for t in built]}")
        self.scorer = scorer
        self.max_turns = check_max_turns(max_turns)

    async def step(self, ctx: TurnContext) -> Feedback:
        try:
            call = parse_tool_call(ctx.text, self.tools)
        except ToolCallError as exc:
            if ctx.last_turn:
                return Feedback(done=True, reward=0.0, info={"reason": "turns",
                                                            "error": str(exc)})
            return Feedback(text=f"error: {exc}", role="tool", info={"error": str(exc)})
        if call is None:
            score = self.scorer(ctx.text, ctx.prompt)
            return Feedback(done=True, reward=score, info={"reason": "answer"})
        if ctx.last_turn:
            return Feedback(done=True, reward=0.0, info={"reason": "turns", "tool": call.name})
        result = await call_tool(self.tools[call.name], call)
        return Feedback(text=result, role="tool", info={"tool": call.name})


class RetryEnv:
    """Attempts with "try again" feedback (see module docstring)."""

    name = "retry"

    def __init__(self, scorer: Scorer, max_turns: int = 2,
                 feedback: str | Callable[[TurnContext], str] = "That is not correct. Try again.",
                 retry_discount: float = 1.0) -> None:
        if not 0.0 < retry_discount <= 1.0:
            raise ValueError(f"retry_discount = {retry_discount}: must be in (0, 1]")
        self.scorer = scorer
        self.max_turns = check_max_turns(max_turns)
        self.feedback = feedback
        self.retry_discount = retry_discount

    async def step(self, ctx: TurnContext) -> Feedback:
        score = self.scorer(ctx.text, ctx.prompt)
        if score >= 1.0 or ctx.last_turn:
            return Feedback(done=True, reward=score * self.retry_discount ** ctx.turn,
                            info={"score": score, "attempts": ctx.turn + 1})
        text = self.feedback(ctx) if callable(self.feedback) else self.feedback
        return Feedback(text=text, role="user", info={"score": score})
