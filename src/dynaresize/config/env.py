"""`[env]`: multi-turn episodes in a live run (docs/agents.md). No torch/Ray.

Off by default (`name = ""`): every request is a single-turn sample, as before. With a name,
each sample is an episode of up to `max_turns` model turns, each turn one request of the
step's run, the environment answering between turns (envs.adapters).
"""

from __future__ import annotations

from dataclasses import dataclass

from dynaresize.config.fields import doc_field as _doc

ENV_NAMES = ("", "retry", "tools")
ENV_TOOLS = ("calculator",)
RENDERERS = ("plain", "chat")
REPEAT_QUESTION = "repeat_question"
"""`env.feedback`: show the question again (the prompt's text) instead of a fixed text."""


@dataclass
class EnvConfig:
    """`[env]`: multi-turn episodes (docs/agents.md)."""

    name: str = _doc("Environment of each sample: '' (off: single-turn samples), 'retry' (each "
                     "turn is an attempt; a wrong one gets `feedback`), 'tools' (turns may "
                     "call `tools`; a turn without a call is the answer).", default="")
    max_turns: int = _doc("Most model turns per episode.", default=2)
    tools: str = _doc("'tools': comma-separated tool names (built in: 'calculator').",
                      default="calculator")
    renderer: str = _doc("How an observation becomes context tokens: 'plain' (`template` "
                         "encoded, any tokenizer) or 'chat' (the model's chat template).",
                         default="plain")
    template: str = _doc("'plain' renderer: the observation's text, with {role} and {text}.",
                         default=" {role}: {text} ")
    feedback: str = _doc("'retry': the text after a wrong attempt, or 'repeat_question' (the "
                         "question again).", default="wrong, try again.")
    retry_discount: float = _doc("'retry': reward of a success at turn t is score x "
                                 "retry_discount^t (in (0, 1]).", default=1.0)
    max_context_tokens: int = _doc("End an episode (reward 0) before a turn whose prompt "
                                   "would be longer (0: no limit).", default=0)
    latency_s: float = _doc("Seconds every environment answer sleeps (a slow tool, to measure "
                            "the engine work overlapping it; 0: none).", default=0.0)
