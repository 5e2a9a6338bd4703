"""Calibration: the fitted parameters map onto a CostModel that charges exactly them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dynaresize.sim.calibrate import (
    _nnls,
    cost_model_from_fit,
    list_schedule_iters,
    load_calibration,
)

FIT = {"iteration_overhead_s": 0.02, "decode_s_per_request_iter": 4e-4,
       "prefill_s_per_token": 1e-3, "train_step_overhead_s": 0.3, "train_s_per_token": 9e-5,
       "weight_sync_latency_s": 0.07, "weight_transfer_s": 0.01, "max_running_requests": 32.0}


def test_cost_model_charges_the_fitted_parameters() -> None:
    c = cost_model_from_fit(FIT)
    for batch in (1, 8, 32):
        assert c.decode_iter_s(batch, 500) == pytest.approx(0.02 + 4e-4 * batch, rel=1e-6)
    assert c.prefill_s(100) == pytest.approx(0.1)
    assert c.train_step_s(10_000, 2) == pytest.approx(0.3 + 9e-5 * 5_000)
    assert c.weight_sync_s() == pytest.approx(0.08)
    assert c.max_running_requests == 32
    assert c.kv_capacity_tokens() > 10**9


def test_list_schedule_iters() -> None:
    assert list_schedule_iters([5, 3, 2], 4) == 5
    assert list_schedule_iters([5, 3, 2], 1) == 10
    assert list_schedule_iters([4, 4, 4], 2) == 8


def test_nnls_drops_negative_terms() -> None:
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.uniform(1, 2, 50), rng.uniform(1, 2, 50)])
    y = 3 * x[:, 0]
    coef = _nnls(x, y)
    assert coef[0] == pytest.approx(3) and coef[1] == pytest.approx(0, abs=1e-9)


def test_load_calibration_names_bad_field(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"fitted": FIT | {"train_s_per_token": "x"}}))
    with pytest.raises(ValueError, match="fitted.train_s_per_token"):
        load_calibration(path)
    path.write_text(json.dumps({"fitted": FIT}))
    assert load_calibration(path).train_step_overhead_s == 0.3
