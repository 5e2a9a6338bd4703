"""`[env]`: parsing, defaults, and the refused values and combinations (config/env.py)."""

from __future__ import annotations

import pytest

from dynaresize.config import Config, ConfigError, load_config, to_toml


def _load(*overrides: str) -> Config:
    return load_config(None, list(overrides), check_machine=False)


def test_env_is_off_by_default_and_round_trips_through_toml() -> None:
    cfg = _load()
    assert cfg.env.name == "" and cfg.env.max_turns == 2
    assert cfg.env.template == " {role}: {text} " and cfg.env.max_context_tokens == 0
    assert "[env]" in to_toml(cfg)


def test_env_values_parse() -> None:
    cfg = _load('env.name="retry"', "env.max_turns=3", 'env.feedback="repeat_question"',
                "env.retry_discount=0.5", "env.latency_s=0.2")
    assert (cfg.env.name, cfg.env.max_turns, cfg.env.feedback) == ("retry", 3,
                                                                    "repeat_question")
    assert cfg.env.retry_discount == 0.5 and cfg.env.latency_s == 0.2


@pytest.mark.parametrize(("override", "field", "allowed"), [
    ('env.name="chess"', "env.name", "retry"),
    ("env.max_turns=0", "env.max_turns", ">= 1"),
    ('env.renderer="html"', "env.renderer", "plain"),
    ('env.tools="calculator,shell"', "env.tools", "calculator"),
    ('env.template=" {who}: {text} "', "env.template", "{role}"),
    ("env.retry_discount=0.0", "env.retry_discount", "(0, 1]"),
    ("env.max_context_tokens=-1", "env.max_context_tokens", ">= 0"),
    ("env.latency_s=-0.5", "env.latency_s", ">= 0"),
])
def test_bad_env_values_name_field_value_and_allowed(override: str, field: str,
                                                     allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load('env.name="retry"', override) if "env.name" not in override else _load(override)
    assert err.value.field_name == field and allowed in err.value.allowed


@pytest.mark.parametrize("overrides", [
    ["train.dynamic_sampling.enabled=true"],
    ['devices.backend="sim"'],
    ['env.renderer="chat"'],
])
def test_unsupported_combinations_are_refused(overrides: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        _load('env.name="retry"', *overrides)
    assert err.value.field_name in ("env.name", "env.renderer")
    assert "episodes" in err.value.allowed or "chat template" in err.value.allowed


def test_the_same_values_without_env_are_accepted() -> None:
    cfg = _load("train.dynamic_sampling.enabled=true", 'env.renderer="chat"')
    assert cfg.env.name == "" and cfg.train.dynamic_sampling.enabled
