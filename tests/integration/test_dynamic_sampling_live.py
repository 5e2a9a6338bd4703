"""Dynamic sampling (`[train.dynamic_sampling]`, core/dynamic_sampling.py) on the real path:
which prompts enter a step's batch (dispatched up front or topped up live as groups finish)
and which groups are kept is a function of the seed and the rewards only, so a run with a
forced schedule of resizes (some mid-rollout, requests migrated) writes the same records,
kept and dropped groups alike, and ends with the same parameters as the static run. The DAPO
loss options are on too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_resize_live import BASE, SCHEDULE

from dynaresize.config import load_config
from dynaresize.core.rundir import read_jsonl

pytestmark = pytest.mark.ray

DAPO = ["train.dynamic_sampling.enabled=true", "train.dynamic_sampling.max_rounds=2",
        "train.loss.clip_high=0.28", "train.loss.overlong_window=8"]


def run(pool: Any, out: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*BASE, *DAPO, *overrides])
    return run_training(cfg, out, pool=pool(cfg.num_devices))


def view(path: Path) -> dict[tuple[int, int, int], tuple]:
    records = read_jsonl(path / "samples.jsonl")
    out = {(r["step"], r["prompt"], r["sample"]): (r["version"], r["tokens_sha256"],
                                                   r["reward"], r["kept"]) for r in records}
    assert len(out) == len(records), "a sample was recorded twice"
    return out


@pytest.fixture(scope="module")
def static_dir(device_pool: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ds-static")
    run(device_pool, out, BUDGET, "controller.policy='static'")  # trains after the rollout
    return out


BUDGET = "train.max_tokens_per_micro_batch=64"
"""Token-budgeted micro-batches: what lets dynamic sampling stream (`KeepTracker`)."""


def test_forced_resizes_keep_the_dynamic_sampling_records(device_pool: Any, static_dir: Path,
                                                          tmp_path: Path) -> None:
    static = read_summary(static_dir)
    resized = run(device_pool, tmp_path / "resized", BUDGET, SCHEDULE)
    assert resized["num_resizes"] == 4
    assert view(tmp_path / "resized") == view(static_dir)
    assert resized["param_sha256"] == static["param_sha256"]
    records = read_jsonl(static_dir / "samples.jsonl")
    per_step: dict[int, set[int]] = {}
    for r in records:
        if r["kept"]:
            per_step.setdefault(r["step"], set()).add(r["prompt"])
    assert all(len(prompts) == 4 for prompts in per_step.values())  # B groups train
    assert any(not r["kept"] for r in records)  # groups without a signal: topped up live


def test_streamed_training_of_kept_groups_gives_the_static_update(device_pool: Any,
                                                                  static_dir: Path,
                                                                  tmp_path: Path) -> None:
    """`fixed` streams training through the rollout: kept groups train as soon as they are
    known to be kept (`KeepTracker`); the records and the parameters are those of the static
    run, which trains the assembled step after its rollout."""
    streamed = run(device_pool, tmp_path, BUDGET, "controller.policy='fixed'")
    assert view(tmp_path) == view(static_dir)
    assert streamed["param_sha256"] == read_summary(static_dir)["param_sha256"]
    trains: dict[int, int] = {}  # streaming writes one train event per micro-batch
    for e in read_jsonl(tmp_path / "events.jsonl"):
        if e["kind"] == "train":
            trains[e["step"]] = trains.get(e["step"], 0) + 1
    assert max(trains.values()) > 2  # more than one per training device: it streamed


def read_summary(path: Path) -> dict:
    import json

    return json.loads((path / "summary.json").read_text())
