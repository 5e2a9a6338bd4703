"""Metric sinks: TensorBoard event files in the run directory, W&B only when asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynaresize.app.metric_sinks import make_sinks, scalars
from dynaresize.app.progress import Progress
from dynaresize.config import Config
from dynaresize.core.rundir import RunDir

RECORD = {"step": 3, "reward_mean": 0.5, "rollout_s": 1.0, "train_s": 2.0, "step_s": 3.0,
          "train_device_s": 4.0,
          "num_rollout_devices": 2, "num_train_devices": 2, "num_resizes": 0, "tokens": 10,
          "policy_version": 2, "eval_version": 3, "eval_accuracy": 0.25, "eval_reward": 0.5,
          "eval_s": 1.5}


def test_scalars_keep_numbers_only() -> None:
    got = scalars({**RECORD, "flag": True, "name": "x"})
    assert "step" not in got and "flag" not in got and "name" not in got
    assert got["eval_accuracy"] == 0.25 and got["tokens"] == 10.0


def test_tensorboard_events_written_through_the_run_directory(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rundir = RunDir(tmp_path)
    rundir.add_sinks(make_sinks(Config(), tmp_path))
    rundir.metric(RECORD)
    rundir.metric({**RECORD, "step": 4, "eval_accuracy": 0.5})
    rundir.close()
    files = list(tmp_path.glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("eval/eval_accuracy")] == [(3, 0.25),
                                                                             (4, 0.5)]
    assert "train/reward_mean" in acc.Tags()["scalars"]


def test_sinks_off_or_without_a_directory(tmp_path: Path) -> None:
    cfg = Config()
    cfg.output.tensorboard = False
    assert make_sinks(cfg, tmp_path) == []
    assert make_sinks(Config(), None) == []


def test_wandb_missing_is_a_notice_not_a_crash(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import dynaresize.app.metric_sinks as sinks

    cfg = Config()
    cfg.output.tensorboard = False
    cfg.output.wandb = True
    monkeypatch.setattr(sinks.importlib.util, "find_spec", lambda name: None)
    notes: list[str] = []
    assert make_sinks(cfg, tmp_path, notes.append) == []
    assert "pip install wandb" in notes[0]


def test_progress_line_shows_the_evaluation() -> None:
    import io

    out = io.StringIO()
    Progress(10, "plain", out).step(RECORD)
    line = out.getvalue()
    assert "eval(v3) accuracy 0.250 reward 0.500" in line
    out = io.StringIO()
    Progress(10, "plain", out).step({k: v for k, v in RECORD.items()
                                     if not k.startswith("eval_")})
    assert "eval" not in out.getvalue()
