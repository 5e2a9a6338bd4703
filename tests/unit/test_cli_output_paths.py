"""Output paths and flags that cannot work, through the `dynaresize` command: exit code 2 and
one line naming the flag, the value and what is allowed, before any work starts (nothing
written, no traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynaresize.cli import EXIT_USAGE, main


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def afile(tmp_path: Path) -> Path:
    file = tmp_path / "afile"
    file.write_text("keep me\n")
    return file


SIMULATE = ["simulate", "--gpus", "6", "--steps", "2", "--requests-per-step", "32",
            "--split", "3", "--policy", "static"]


def test_train_out_that_is_a_file(afile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, "train", "--out", str(afile), "--set", "run.steps=1")
    assert f"--out {afile}: exists and is not a directory" in err
    err = one_line_error(capsys, "train", "--out", str(afile / "run"), "--dry-run")
    assert f"--out {afile / 'run'}: {afile} is a file" in err
    assert afile.read_text() == "keep me\n"


def test_simulate_out_that_is_a_file(afile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, *SIMULATE, "--out", str(afile))
    assert f"--out {afile}: exists and is not a directory" in err
    assert afile.read_text() == "keep me\n"


def test_simulate_out_that_can_be_created(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new" / "sim"
    assert main([*SIMULATE, "--out", str(out)]) == 0
    assert (out / "simulate.json").is_file()


def make_run_dir(root: Path) -> Path:
    """A run directory's config.toml (the out checks run before its weights are read)."""
    from dynaresize.config import load_config, to_toml

    run = root / "run"
    run.mkdir()
    (run / "config.toml").write_text(to_toml(load_config(None, [], check_machine=False)))
    return run


def test_export_out_that_cannot_be_written(tmp_path: Path, afile: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run_dir(tmp_path)
    err = one_line_error(capsys, "export", str(run), "--out", str(afile))
    assert f"--out {afile}: exists and is not a directory" in err
    err = one_line_error(capsys, "export", str(run), "--out", "")
    assert "--out '': give the path of a directory" in err
    err = one_line_error(capsys, "export", str(run), "--out", ".")
    assert "--out '.': names no folder of its own" in err
    err = one_line_error(capsys, "export", str(run), "--out", str(afile / "hf"))
    assert f"{afile} is a file" in err
    err = one_line_error(capsys, "export", str(run), "--out", str(tmp_path))
    assert "holds the run directory" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    err = one_line_error(capsys, "export", str(run), "--out", str(other))
    assert "a folder with other files" in err
    assert (other / "notes.txt").read_text() == "mine\n" and afile.read_text() == "keep me\n"
    assert not list(tmp_path.glob("*.tmp-export"))


def test_calibrate_out_in_a_missing_directory(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run_dir(tmp_path)
    target = tmp_path / "nodir" / "cal.json"
    err = one_line_error(capsys, "calibrate", str(run), "--out", str(target))
    assert f"--out {target}: directory {target.parent} does not exist" in err
    err = one_line_error(capsys, "calibrate", str(run), "--out", str(run))
    assert f"--out {run}: is a directory" in err


def test_bench_resize_out_checked_before_the_benchmark(
        afile: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    import dynaresize.app.benchmarks.resize_latency as bench

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(bench, "run_resize_bench", never)
    err = one_line_error(capsys, "bench", "resize", "--models", "tiny",
                         "--out", str(afile / "x.json"))
    assert f"--out {afile / 'x.json'}: {afile} is a file" in err


@pytest.mark.parametrize(("flags", "message"), [
    (["--trials", "0"], "--trials 0: must be >= 1"),
    (["--trials", "-3"], "--trials -3: must be >= 1"),
    (["--first-seed", "-1"], "--first-seed -1: must be >= 0"),
])
def test_bench_chaos_bad_counts(capsys: pytest.CaptureFixture[str], flags: list[str],
                                message: str) -> None:
    assert message in one_line_error(capsys, "bench", "chaos", *flags)


def test_simulate_seed_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--seed -1: must be >= 0" in one_line_error(capsys, *SIMULATE, "--seed", "-1")


@pytest.mark.parametrize(("policy", "message"), [
    ("static,,hysteresis", "an empty policy name"),
    ("static,", "an empty policy name"),
    ("static,static", "'static' is given twice"),
])
def test_simulate_policy_list(capsys: pytest.CaptureFixture[str], policy: str,
                              message: str) -> None:
    argv = [*SIMULATE[:-1], policy]
    assert f"--policy {policy!r}: {message}" in one_line_error(capsys, *argv)


def test_simulate_config_refuses_unknown_sim_keys(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "twin.toml"
    config.write_text("[sim]\nbogus = 1\n")
    err = one_line_error(capsys, *SIMULATE, "--config", str(config))
    assert f"{config}: sim.bogus = 1: unknown key" in err and "sim.speculation" in err
    err = one_line_error(capsys, *SIMULATE, "--config", str(config), "--speculation", "das")
    assert "sim.bogus" in err
    err = one_line_error(capsys, *SIMULATE, "--set", "sim.bogus=1")
    assert "sim.bogus=1" in err
