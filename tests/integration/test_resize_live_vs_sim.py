"""Acceptance 1, live half: the forced schedule run live records the same sequence of resize
ops, devices and allocations as the twin (tests/unit/test_sim_resize.py pins the sim half)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dynaresize.config import load_config
from dynaresize.core.rundir import read_jsonl
from dynaresize.core.timeline import allocation_sequence, resize_sequence

pytestmark = pytest.mark.ray


def _sim_half() -> ModuleType:
    """tests/unit/test_sim_resize.py: the shared config, schedule and expected sequence."""
    path = Path(__file__).parents[1] / "unit" / "test_sim_resize.py"
    spec = importlib.util.spec_from_file_location("sim_resize_half", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_live_and_sim_resize_sequences_match(device_pool: Any, tmp_path: Path) -> None:
    from dynaresize.app.runner import run_training

    half = _sim_half()
    cfg = load_config(None, [*half.BASE, half.SCHEDULE])
    run_training(cfg, tmp_path, pool=device_pool(cfg.num_devices))
    live = resize_sequence(read_jsonl(tmp_path / "events.jsonl"))
    _, sim_events = half.simulate_live_config()
    sim = resize_sequence(sim_events)
    assert live == sim == half.EXPECTED
    assert allocation_sequence(live, 2, 4) == allocation_sequence(sim, 2, 4)
