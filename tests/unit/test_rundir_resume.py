"""A driver killed with SIGKILL leaves its jsonl files as they were: a last line cut mid-write,
records of steps after the last checkpoint. `RunDir(resume_step=K)` keeps each record of the
steps < K once and drops the rest, so nothing is written twice; `driver_kill.session_pids`
finds the processes a driver left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dynaresize.core.rundir import RunDir, read_jsonl


def line(record: dict) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def test_resume_drops_cut_lines_later_steps_and_duplicates(tmp_path: Path) -> None:
    metrics = [{"step": k, "loss": 0.1 * k} for k in range(4)]
    samples = [{"step": k, "prompt": p, "sample": 0} for k in range(4) for p in range(2)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(map(line, metrics + metrics[1:2])) + '{"step": 4, "lo')  # cut by the kill
    (tmp_path / "samples.jsonl").write_text("".join(map(line, samples + samples[:1])))
    (tmp_path / "events.jsonl").write_text(line({"t_start": 0, "t_end": 7.5}) + '{"t_st')
    run = RunDir(tmp_path, resume_step=2)
    run.metric({"step": 2, "reward_mean": 0.0, "rollout_s": 0.0, "train_s": 0.0, "step_s": 0.0,
                "num_rollout_devices": 1, "num_train_devices": 1, "num_resizes": 0, "tokens": 1,
                "policy_version": 1, "loss": 0.0, "train_device_s": 0.0})
    run.close()
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert [(s["step"], s["prompt"]) for s in read_jsonl(tmp_path / "samples.jsonl")] == \
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(read_jsonl(tmp_path / "events.jsonl")) == 1 and run.t_offset_s == 7.5
    assert run.dropped_on_resume == {"metrics": 3, "samples": 5, "events": 0}


def test_a_bad_line_inside_a_file_is_still_an_error(tmp_path: Path) -> None:
    import pytest

    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"ste\n{"step": 1}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        RunDir(tmp_path, resume_step=1)


def test_session_pids_finds_this_session() -> None:
    from dynaresize.app.driver_kill import session_pids

    assert os.getpid() in session_pids(os.getsid(0))


def test_a_driver_past_its_limit_is_ended_with_its_whole_session(tmp_path: Path) -> None:
    # the bench's driver and what it started (here a child): none may outlive the limit
    import sys

    from dynaresize.app.driver_kill import run_bounded, session_pids, start

    child = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    proc = start([sys.executable, "-c", child], tmp_path / "log")
    assert run_bounded(proc, 1.0) == "timeout"
    assert proc.poll() is not None and session_pids(proc.pid) == []


def test_a_run_killed_before_its_first_checkpoint_starts_over(tmp_path: Path) -> None:
    from dynaresize.orchestrator.checkpoint_files import started_without_checkpoint

    assert not started_without_checkpoint(tmp_path)  # no config.toml: not a run directory
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "checkpoints" / "step-000002").mkdir(parents=True)  # a save cut short
    assert started_without_checkpoint(tmp_path)
    (tmp_path / "checkpoints" / "step-000002" / "state.json").write_text("{}")
    assert not started_without_checkpoint(tmp_path)  # one to resume from (or to refuse)
