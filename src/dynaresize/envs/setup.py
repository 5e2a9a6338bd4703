"""The environment and renderer of a live run, from its `[env]` config and its task.

* the scorer: a text task's own (`adapters.task_scorer`); any other task (the built-in count
  task, jsonl) scores a turn's text as the task's reward of that text encoded and ended with
  EOS (`token_scorer`);
* `retry` → `RetryEnv(scorer, max_turns, feedback, retry_discount)`, feedback
  'repeat_question' showing the prompt's text again; `tools` → `ToolEnv(tools, scorer)`;
* `latency_s` > 0 wraps the environment in `SlowEnv`: every answer first sleeps on the run's
  clock (a slow tool, off the engine);
* the renderer: `PlainRenderer(tokenizer, template)` or `ChatRenderer(tokenizer)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dynaresize.config.env import REPEAT_QUESTION, EnvConfig
from dynaresize.envs.adapters import RetryEnv, Scorer, ToolEnv, task_scorer
from dynaresize.envs.base import Environment, Feedback, TurnContext
from dynaresize.envs.render import ChatRenderer, PlainRenderer, Renderer
from dynaresize.envs.tools import calculator
from dynaresize.protocols import Clock
from dynaresize.tasks.base import Prompt
from dynaresize.tasks.text import TextTask

TOOLS: dict[str, Callable[..., Any]] = {"calculator": calculator}


class SlowEnv:
    """An environment whose every answer first waits `latency_s` on `clock`."""

    def __init__(self, env: Environment, latency_s: float, clock: Clock) -> None:
        self.env = env
        self.name = env.name
        self.max_turns = env.max_turns
        self.latency_s = latency_s
        self.clock = clock

    async def step(self, ctx: TurnContext) -> Feedback:
        await self.clock.sleep(self.latency_s)
        return await self.env.step(ctx)


@dataclass(frozen=True)
class EnvSetup:
    """What a step's episodes are run with (`orchestrator.episodes`)."""

    env: Environment
    renderer: Renderer
    max_context_tokens: int = 0


def token_scorer(task: Any) -> Scorer:
    """A turn's text scored by a token-level task: its reward of the text + EOS."""
    tokenizer = task.tokenizer

    def score(text: str, prompt: Prompt) -> float:
        try:
            tokens = tokenizer.encode(text)
        except ValueError:  # a character the task's tokenizer does not know
            return 0.0
        return float(task.reward(prompt, [*tokens, tokenizer.eos_id]))

    return score


def build_env(cfg: EnvConfig, task: Any, clock: Clock) -> EnvSetup:
    """The environment and renderer of `cfg` (its `name` must not be '') over `task`."""
    scorer = task_scorer(task) if isinstance(task, TextTask) else token_scorer(task)
    tokenizer = task.tokenizer
    env: Environment
    if cfg.name == "retry":
        feedback: str | Callable[[TurnContext], str] = cfg.feedback
        if cfg.feedback == REPEAT_QUESTION:
            def feedback(ctx: TurnContext) -> str:
                return str(tokenizer.decode(list(ctx.prompt.tokens)))
        env = RetryEnv(scorer, cfg.max_turns, feedback, cfg.retry_discount)
    elif cfg.name == "tools":
        names = [t.strip() for t in cfg.tools.split(",") if t.strip()]
        env = ToolEnv([TOOLS[n] for n in names], scorer, cfg.max_turns)
    else:
        raise ValueError(f"env.name = {cfg.name!r}: allowed: retry, tools")
    if cfg.latency_s > 0:
        env = SlowEnv(env, cfg.latency_s, clock)
    renderer: Renderer = ChatRenderer(tokenizer) if cfg.renderer == "chat" \
        else PlainRenderer(tokenizer, cfg.template)
    return EnvSetup(env, renderer, cfg.max_context_tokens)
