"""Malformed user input through the `dynaresize` command: exit code 2, a message naming the
file, line and field, and no traceback (nothing is started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynaresize.cli import EXIT_USAGE, main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_bad_task_dataset_names_file_line_and_field(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "ab", "answer": "c"}\n{"prompt": 3, "answer": "x"}\n')
    err = run_cli(capsys, "train", "--dry-run", "--set", "task.name='jsonl'",
                  "--set", f"task.path='{data}'")
    assert f"{data}:2" in err and "'prompt'" in err and "string" in err


def test_bad_config_value_names_field_and_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_cli(capsys, "train", "--dry-run", "--set", "rollout.temperature=nan")
    assert "rollout.temperature" in err and "finite" in err


def test_unknown_policy_names_the_registered_ones(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_cli(capsys, "train", "--dry-run", "--set", "controller.policy='magic'")
    assert "controller.policy" in err and "'magic'" in err and "hysteresis" in err


def test_resume_without_checkpoint_is_refused(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    err = run_cli(capsys, "train", "--resume", str(tmp_path))
    assert "no checkpoint" in err and "checkpoint_every" in err


def test_resume_refuses_changing_the_seed(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from dynaresize.config import load_config, to_toml

    (tmp_path / "config.toml").write_text(to_toml(load_config(None, ["run.steps=4"])))
    step = tmp_path / "checkpoints" / "step-000002"
    (step / "train").mkdir(parents=True)
    (step / "state.json").write_text(json.dumps(
        {"num_steps": 2, "seed": 0, "staleness": 1, "allocation": [], "weight_files": {},
         "train_dir": "train"}))
    (tmp_path / "checkpoints" / "latest").write_text("step-000002\n")
    assert main(["train", "--resume", str(tmp_path), "--dry-run",
                 "--set", "allocation.num_train_devices=3"]) == 0
    capsys.readouterr()
    err = run_cli(capsys, "train", "--resume", str(tmp_path), "--set", "run.seed=5")
    assert "run.seed" in err and "--resume" in err


def test_bad_trace_names_line_and_field(tmp_path: Path) -> None:
    from dynaresize.sim.workloads import load_trace

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"step": 0, "prompt": 0, "sample": 0, "response_tokens": -1, '
                     '"prompt_tokens": 3}\n')
    with pytest.raises(ValueError, match=r"t.jsonl: line 1: field 'response_tokens'"):
        load_trace(str(trace))
