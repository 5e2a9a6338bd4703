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
    (["--staleness", "3"], "staleness = 3"),
    (["--steps", "0"], "--steps 0"),
    (["--calibration", "/nonexistent.json"], "/nonexistent.json"),
])
def test_simulate_bad_input_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str],
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
