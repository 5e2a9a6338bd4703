"""`dynaresize simulate`, `report` and `calibrate`: output shapes and exit codes (2 for bad
input, with a message naming the field or line, and no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynaresize.cli import main

SMALL = ["--gpus", "6", "--steps", "2", "--requests-per-step", "32"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_json_is_one_object_with_oracle(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", *SMALL, "--policy", "static,borrow,oracle",
                       "--json")
    assert code == 0
    obj = json.loads(out)
    assert set(obj) >= {"workload", "gpus", "steps", "results"}
    assert [r["policy"] for r in obj["results"]] == ["static", "borrow", "oracle"]
    for r in obj["results"]:
        assert {"policy", "split", "mean_step_s", "p99_step_s", "samples_per_s",
                "tokens_per_s", "bubble_fraction", "num_resizes"} <= set(r)


def test_simulate_text_and_out_dirs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "simulate", *SMALL, "--policy", "static,colocated,oracle",
                       "--out", str(tmp_path))
    assert code == 0
    assert "policy" in out and "static" in out and "colocated" in out
    for policy in ("static", "colocated"):
        for name in ("metrics.jsonl", "events.jsonl", "samples.jsonl", "summary.json",
                     "config.toml"):
            assert (tmp_path / policy / name).is_file(), (policy, name)
    code, out, _ = run(capsys, "report", str(tmp_path / "static"))
    assert code == 0 and "mean step" in out
    for name in ("timeline.png", "utilisation.png", "stages.png", "summary.txt"):
        assert (tmp_path / "static" / name).stat().st_size > 0


@pytest.mark.parametrize("argv,needle", [
    (["--workload", "nope"], "workload 'nope'"),
    (["--gpus", "1"], "--gpus 1"),
    (["--policy", "static,nope"], "policy 'nope'"),
    (["--staleness", "9"], "staleness = 9"),
    (["--steps", "0"], "--steps 0"),
    (["--workers", "0"], "--workers 0"),
    (["--calibration", "/nonexistent.json"], "/nonexistent.json"),
])
def test_simulate_bad_input_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                    needle: str) -> None:
    code, _, err = run(capsys, "simulate", *SMALL, *argv)
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_simulate_runs_faults_from_a_train_config(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    config = tmp_path / "train.toml"  # a live config: its other sections are not the twin's
    config.write_text("[run]\nsteps = 9\ncheckpoint_every = 1\n[model]\nname = 'tiny'\n"
                      "[[faults.kill]]\ndevice = 5\nstep = 1\nat = 'train'\n")
    code, out, _ = run(capsys, "simulate", *SMALL, "--split", "3", "--config", str(config),
                       "--json", "--out", str(tmp_path / "out"))
    assert code == 0
    rows = json.loads(out)["results"]
    assert [r["policy"] for r in rows] == ["static", "borrow", "hysteresis", "reference"]
    assert all(r["num_faults"] == 1 and r["replayed_steps"] == 0 for r in rows)
    summary = json.loads((tmp_path / "out" / "static" / "summary.json").read_text())
    assert summary["kills"][0]["device"] == 5 and summary["faults"][0]["restored"]
    assert (tmp_path / "out" / "static" / "checkpoints" / "latest").is_file()
    code, out, _ = run(capsys, "simulate", *SMALL, "--split", "3", "--policy", "static",
                       "--set", "faults.kill=[{device=0, step=0, at='rollout:0.5'}]")
    assert code == 0 and "static: 1 device death(s)" in out


@pytest.mark.parametrize("argv,needle", [
    (["--set", "faults.kill=[{device=6, step=0, at='train'}]"], "faults.kill[0].device = 6"),
    (["--set", "faults.kill=[{device=1, step=2, at='train'}]"], "faults.kill[0].step = 2"),
    (["--set", "faults.kill=[{device=1, step=0, at='later'}]"], "faults.kill[0].at = 'later'"),
    (["--set", "faults.kill=[{device=1, stp=0}]"], "faults.kill[0].stp"),
    (["--set", "faults.kill=[{device=1, step=0, how='hang'}]", "--set",
      "faults.hang_timeout_s=0"], "faults.kill[0].how = 'hang'"),
    (["--set", "run.steps=3"], "run.steps=3"),
    (["--set", "run.checkpoint_every=-1"], "run.checkpoint_every = -1"),
    (["--set", "faults.kill=[{device=1}]", "--policy", "oracle"], "policy 'oracle'"),
    (["--config", "/nonexistent.toml"], "/nonexistent.toml"),
])
def test_simulate_bad_faults_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                    needle: str) -> None:
    code, _, err = run(capsys, "simulate", *SMALL, *argv)
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_simulate_bad_trace_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    good = {"step": 0, "prompt": 0, "sample": 0, "response_tokens": 5, "prompt_tokens": 3}
    trace.write_text(json.dumps(good) + "\n" + json.dumps(good | {"sample": 1,
                                                                   "response_tokens": -1}) + "\n")
    code, _, err = run(capsys, "simulate", "--workload", str(trace), "--gpus", "2")
    assert code == 2
    assert "line 2" in err and "response_tokens" in err


def test_report_malformed_run_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "report", str(tmp_path))
    assert code == 2 and "metrics.jsonl" in err
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    code, _, err = run(capsys, "report", str(tmp_path))
    assert code == 2 and "metrics.jsonl" in err and "record 1" in err
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "events.jsonl").write_text('{"t_start": 0}\nnot json\n')
    code, _, err = run(capsys, "report", str(tmp_path))
    assert code == 2 and "events.jsonl:2" in err


def test_calibrate_missing_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "calibrate", str(tmp_path))
    assert code == 2 and "config.toml" in err
