"""Dynamic sampling (`[train.dynamic_sampling]`, core/dynamic_sampling.py) on the real path:
which prompts are drawn and which groups are kept is a function of the seed and the rewards
only, so a run with a forced schedule of resizes (some mid-rollout, requests migrated) writes
the same records, kept and dropped groups alike, and ends with the same parameters as the
static run. The DAPO loss options are on too."""

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


def test_forced_resizes_keep_the_dynamic_sampling_records(device_pool: Any,
                                                          tmp_path: Path) -> None:
    static = run(device_pool, tmp_path / "static")
    resized = run(device_pool, tmp_path / "resized", SCHEDULE)
    assert resized["num_resizes"] == 4
    assert view(tmp_path / "resized") == view(tmp_path / "static")
    assert resized["param_sha256"] == static["param_sha256"]
    records = read_jsonl(tmp_path / "static" / "samples.jsonl")
    per_step: dict[int, set[int]] = {}
    for r in records:
        if r["kept"]:
            per_step.setdefault(r["step"], set()).add(r["prompt"])
    assert all(len(prompts) == 4 for prompts in per_step.values())  # B groups train
    assert any(not r["kept"] for r in records)  # later steps drew a second round
