"""Validation of `[env]` (config.env) and of the combinations episodes do not support."""

from __future__ import annotations

from typing import Any

from dynaresize.config.env import ENV_NAMES, ENV_TOOLS, RENDERERS
from dynaresize.config.schema import Config, ConfigError


def _error(name: str, value: Any, allowed: str) -> Exception:
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
