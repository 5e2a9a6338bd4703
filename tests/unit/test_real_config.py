"""Config fields of real models, text tasks and evaluation: TOML tables round-trip."""

from __future__ import annotations

import tomllib

import pytest

from dynaresize.config import ConfigError, load_config, to_toml

TEXT = ["task.name='reasoning_gym'", "task.generator='chain_sum'", "model.path='.'"]


def test_generator_args_table_round_trips_through_toml(tmp_path) -> None:
    cfg = load_config(None, [*TEXT, "task.generator_args={min_digits=2, operators=['+'], "
                                    "allow_negation=false}", "eval.every=4"],
                      check_machine=False)
    assert cfg.task.generator_args == {"min_digits": 2, "operators": ["+"],
                                       "allow_negation": False}
    text = to_toml(cfg)
    assert tomllib.loads(text)["task"]["generator_args"] == cfg.task.generator_args
    path = tmp_path / "c.toml"
    path.write_text(text)
    again = load_config(path, check_machine=False)
    assert again.to_dict() == cfg.to_dict()


def test_defaults_keep_the_tiny_run() -> None:
    cfg = load_config(None, [], check_machine=False)
    assert cfg.model.source == "" and cfg.eval.every == 0
    assert cfg.rollout.whole_prompt_prefill is False and cfg.task.name == "count"


@pytest.mark.parametrize("override, field", [
    ("task.generator_args=3", "task.generator_args"),
    ("task.format='prose'", "task.format"),
    ("eval.num_prompts=0", "eval.num_prompts"),
    ("eval.every=-1", "eval.every"),
    ("task.num_fewshot=-1", "task.num_fewshot"),
])
def test_bad_values_name_the_field(override: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, [*TEXT, override], check_machine=False)


def test_reasoning_gym_needs_a_generator_and_math_a_file() -> None:
    with pytest.raises(ConfigError, match="task.generator"):
        load_config(None, ["task.name='reasoning_gym'", "model.path='.'"],
                    check_machine=False)
    with pytest.raises(ConfigError, match="task.path"):
        load_config(None, ["task.name='math'", "model.path='.'"], check_machine=False)
    with pytest.raises(ConfigError, match="model.source"):
        load_config(None, [*TEXT, "model.source='smollm2-135m'"], check_machine=False)
