"""bench/depth_gap.py's per-engine batch and pipeline-depth measures (pure, ms)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from depth_gap import BatchRecorder  # noqa: E402

from dynaresize.core.types import Completion, InflightRequest, RequestSpec  # noqa: E402


def spec(step: int, prompt: int) -> RequestSpec:
    return RequestSpec(step, prompt, 0, 0, (1,), 8, 0)


def done(s: RequestSpec, device: int) -> Completion:
    return Completion(s, [1], [0.0], "length", device, 0)


def test_mean_batch_is_time_weighted_over_busy_time_and_follows_migrations() -> None:
    rec = BatchRecorder()
    a, b, c = spec(0, 0), spec(0, 1), spec(1, 0)
    rec.submitted(0, [a, b], 0.0)           # engine 0 holds 2 for 10 s
    rec.submitted(1, [c], 5.0)              # engine 1 holds step 1's request
    rec.submitted(1, [InflightRequest(b)], 10.0)  # b migrates to engine 1
    rec.finished(0, [done(a, 0)], 20.0, False)     # engine 0: 1 request for 10 s
    rec.finished(1, [done(b, 1), done(c, 1)], 20.0, False)  # engine 1: 1 for 5 s, 2 for 10 s
    # request-seconds 20 + 10 + 5 + 20 = 55 over busy seconds 20 + 15 = 35
    assert rec.mean_batch() == pytest.approx(55 / 35)
    # two steps had requests from 5 s to 20 s of the 20 s with any
    assert rec.overlap_share(2) == pytest.approx(15 / 20) and rec.overlap_share(3) == 0.0
