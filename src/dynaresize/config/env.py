"""`[env]`: multi-turn episodes in a live run (docs/agents.md). No torch/Ray.

Off by default (`name = ""`): every request is a single-turn sample, as before. With a name,
each sample is an episode of up to `max_turns` model turns, each turn one request of the
step's run, the environment answering between turns (envs.adapters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynaresize.config.fields import doc_field as _doc

if TYPE_CHECKING:
    from dynaresize.config.schema import Config

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


def _error(name: str, value: Any, allowed: str) -> Exception:
    from dynaresize.config.schema import ConfigError

    return ConfigError(f"env.{name}", value, allowed)


def validate_env(cfg: Config) -> None:
    """Raise ConfigError on a bad `[env]` value or a combination episodes do not support."""
    env = cfg.env
    if env.name not in ENV_NAMES:
        raise _error("name", env.name, "allowed: '' (off), 'retry', 'tools'")
    if isinstance(env.max_turns, bool) or env.max_turns < 1:
        raise _error("max_turns", env.max_turns, "must be an integer >= 1")
    if env.renderer not in RENDERERS:
        raise _error("renderer", env.renderer, f"allowed: {', '.join(RENDERERS)}")
    tools = [t.strip() for t in env.tools.split(",") if t.strip()]
    if not tools or any(t not in ENV_TOOLS for t in tools):
        raise _error("tools", env.tools, f"comma-separated, from: {', '.join(ENV_TOOLS)}")
    try:
        env.template.format(role="user", text="x")
    except (KeyError, IndexError, ValueError):
        raise _error("template", env.template, "a format string using only {role} and "
                     "{text}") from None
    if not 0.0 < env.retry_discount <= 1.0:
        raise _error("retry_discount", env.retry_discount, "must be in (0, 1]")
    if env.max_context_tokens < 0:
        raise _error("max_context_tokens", env.max_context_tokens, "must be >= 0 (0: no limit)")
    if env.latency_s < 0:
        raise _error("latency_s", env.latency_s, "must be >= 0")
    if not env.name:
        return
    if env.renderer == "chat" and not cfg.model.source and not cfg.model.path:
        raise _error("renderer", env.renderer, "'chat' needs a pretrained model with a chat "
                     "template (model.source or model.path); the tiny model: 'plain'")
    if cfg.train.dynamic_sampling.enabled:
        raise _error("name", env.name, "episodes do not support "
                     "train.dynamic_sampling.enabled = true (set env.name = '' or turn it off)")
    if cfg.devices.backend == "sim":
        raise _error("name", env.name, "episodes run on devices.backend = 'ray' only (the "
                     "twin models them with its 'agentic' workload)")
