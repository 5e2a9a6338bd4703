"""bench/gap.py's measures on a hand-made request log (pure, milliseconds)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gap import Requests, light_s, step_rows  # noqa: E402


class _Costs:
    def decode_span_s(self, num_iters: int, batch: int, prompt: int) -> float:
        return 0.5 * num_iters

    def prefill_s(self, num_tokens: int) -> float:
        return 0.0


def test_step_rows_read_the_longest_request_the_tail_and_the_training_after() -> None:
    log = Requests()
    for i in range(20):  # step 3: request i submitted at i s, done at 10 + 2 i s
        log.submitted[(3, i, 0)] = float(i)
        log.finished[(3, i, 0)] = (10.0 + 2 * i, 100 if i in (4, 7) else 10 + i, 5)
    log.submitted[(4, 0, 0)], log.finished[(4, 0, 0)] = 30.0, (99.0, 500, 5)  # another step
    metrics = [{"step": 3, "step_s": 70.0, "num_rollout_devices": 1}]
    events = [{"kind": "weight_sync", "step": 3, "t_end": 55.0},
              {"kind": "weight_sync", "step": 3, "t_end": 60.0},
              {"kind": "train", "step": 3, "t_end": 99.0}]
    oracle = {3: SimpleNamespace(step_s=40.0)}
    (row,) = step_rows(log, metrics, events, _Costs(), oracle)
    # of the two 100-token requests the later-finishing one (7: submitted 7, done 24)
    assert (row["longest_tokens"], row["longest_s"], row["longest_start_s"]) == (100, 17.0, 7.0)
    assert row["alone_s"] == 50.0 and row["oracle_s"] == 40.0
    assert row["rollout_s"] == 48.0  # first submission 0, last completion 48
    assert row["tail_s"] == 48.0 - 44.0  # 90th percentile completion: index 17 of 0..19
    assert row["light_s"] == 48.0 - 32.0  # 8 left after completion 11 (at 32 s)
    assert row["train_after_s"] == 12.0  # the last weight sync of the step ends at 60


def test_light_covers_the_whole_rollout_when_few_requests_per_device() -> None:
    assert light_s([1.0, 2.0, 5.0], 4) == 4.0
    assert light_s([1.0, 2.0, 5.0, 9.0], 1, per_device=2) == 9.0 - 2.0
