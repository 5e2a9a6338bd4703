"""Config parsing and validation: pure, no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dynaresize.config import ConfigError, config_from_dict, load_config, parse_override, to_toml


def test_defaults_validate_and_round_trip() -> None:
    cfg = load_config()
    assert cfg.num_devices == 4
    assert config_from_dict(cfg.to_dict()) == cfg


def test_toml_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[run]\nsteps = 3\nstaleness = 0\n[allocation]\nnum_rollout_devices = 1\n")
    cfg = load_config(path, ["run.seed=7", "rollout.temperature=0.5"])
    assert (cfg.run.steps, cfg.run.staleness, cfg.run.seed) == (3, 0, 7)
    assert cfg.allocation.num_rollout_devices == 1
    assert cfg.rollout.temperature == 0.5


def test_dry_run_text_parses_back(tmp_path: Path) -> None:
    cfg = load_config(None, ["run.steps=5", "task.name='count'"])
    path = tmp_path / "resolved.toml"
    path.write_text(to_toml(cfg))
    assert load_config(path) == cfg


def test_dry_run_text_keeps_control_characters(tmp_path: Path) -> None:
    """A string with a newline or tab (e.g. `env.template`) is printed escaped, so the
    printed config is valid TOML and loads back to the same value."""
    cfg = load_config(None, ['env.template="\\n{text}\\t"', 'env.feedback="say \\"x\\""'])
    assert cfg.env.template == "\n{text}\t"
    path = tmp_path / "resolved.toml"
    path.write_text(to_toml(cfg))
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    ("override", "field", "needle"),
    [
        ("run.bogus=1", "run.bogus", "unknown key"),
        ("nosuch.key=1", "nosuch", "unknown section"),
        ("run.steps=0", "run.steps", "> 0"),
        ("run.steps=-3", "run.steps", "> 0"),
        ("run.steps='x'", "run.steps", "integer"),
        ("run.staleness=9", "run.staleness", "0 (on-policy)"),
        ("allocation.num_train_devices=0", "allocation.num_train_devices", "> 0"),
        ("allocation.num_rollout_devices=1000", "allocation", "offers at most"),
        ("train.micro_batch_size=7", "train.micro_batch_size", "must divide"),
        ("controller.hysteresis.nope=1", "controller.hysteresis.nope", "unknown key"),
        ("controller.hysteresis=1", "controller.hysteresis", "must be a table"),
        ("controller.borrow.return_fraction=1.5", "controller.borrow.return_fraction",
         "[0, 1]"),
        ("controller.hysteresis.lend_min_cv=-0.5", "controller.hysteresis.lend_min_cv", ">= 0"),
        ("rollout.batch_invariant=3", "rollout.batch_invariant", "true or false"),
        ("task.samples_per_prompt=1", "task.samples_per_prompt", ">= 2"),
        ("faults.hang_timeout_s=46", "faults.hang_timeout_s", "0.75 x faults.timeout_s (45)"),
        ("faults.hang_timeout_s=-1", "faults.hang_timeout_s", "0 (off)"),
        ("faults.hang_timeout_s=0.1", "faults.hang_timeout_s", "from 1 to"),
        ("faults.kill=[{device=1, how='freeze'}]", "faults.kill[0].how", "allowed: kill, hang"),
    ],
)
def test_bad_values_name_field_value_and_rule(override: str, field: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert info.value.field_name == field
    assert needle in str(info.value)


def test_a_hang_needs_the_watchdog(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["faults.hang_timeout_s=0", "faults.kill=[{device=1, how='hang'}]"])
    assert info.value.field_name == "faults.kill[0].how"
    assert "faults.hang_timeout_s > 0" in str(info.value)
    cfg = load_config(None, ["faults.timeout_s=120", "faults.hang_timeout_s=90",
                             "faults.kill=[{device=1, how='hang'}]"])
    assert cfg.faults.kill[0].how == "hang"
    path = tmp_path / "config.toml"                  # what a run directory keeps
    path.write_text(to_toml(cfg))
    assert load_config(path) == cfg


def test_override_syntax() -> None:
    assert parse_override("run.steps=4") == ("run.steps", 4)
    assert parse_override("model.path=/tmp/x") == ("model.path", "/tmp/x")
    with pytest.raises(ConfigError):
        parse_override("steps")
    with pytest.raises(ConfigError):
        parse_override("steps=4")


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nsteps=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


@pytest.mark.parametrize("args", [["--set", "run.steps=0"], ["--set", "bogus.x=1"],
                                  ["--set", "allocation.num_train_devices=999"]])
def test_cli_bad_config_exits_2_without_traceback(args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "dynaresize", "train", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "error:" in proc.stderr
    assert not out.exists()  # nothing started


def test_cli_dry_run_prints_resolved_config() -> None:
    proc = subprocess.run([sys.executable, "-m", "dynaresize", "train", "--dry-run", "--set",
                           "run.steps=3"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "steps = 3" in proc.stdout


def test_config_and_cli_import_without_torch() -> None:
    code = ("import sys, dynaresize.config, dynaresize.cli, dynaresize.orchestrator; "
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_policy_tables_nest_and_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = load_config(None, ["controller.hysteresis.band=0.2",
                             "controller.borrow.return_fraction=0.8"])
    assert cfg.controller.hysteresis.band == 0.2 and cfg.controller.borrow.return_fraction == 0.8
    text = to_toml(cfg)
    assert "[controller.hysteresis]\nband = 0.2" in text
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert load_config(path) == cfg


def test_the_policy_registry_builds_each_name_and_refuses_others() -> None:
    from dynaresize.control.registry import POLICIES, check_policy, make_controller

    assert set(POLICIES) == {"hysteresis", "static", "fixed", "borrow"}
    for name in POLICIES:
        cfg = load_config(None, [f"controller.policy='{name}'"])
        assert make_controller(cfg) is not None
    cfg = load_config(None, ["controller.policy='magic'"])
    with pytest.raises(ConfigError) as info:
        check_policy(cfg)
    assert info.value.field_name == "controller.policy" and "hysteresis" in str(info.value)


def test_gradient_checkpointing_needs_the_exact_path() -> None:
    assert load_config(None, ["train.gradient_checkpointing=true"]).train.gradient_checkpointing
    with pytest.raises(ConfigError) as info:
        load_config(None, ["train.gradient_checkpointing=true", "train.exact_reduction=false"])
    assert "train.gradient_checkpointing" in str(info.value)
    assert "exact_reduction" in str(info.value)
