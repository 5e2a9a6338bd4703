"""rollout.tail_policy: the length predictor, dispatch order and placement (pure, ms), and the
twin with the policy on: every request completes once with the same tokens and versions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dynaresize.config.schema import Config, ConfigError
from dynaresize.config.validate import validate
from dynaresize.core.types import InflightRequest, RequestSpec
from dynaresize.rollout.lengths import LengthPredictor
from dynaresize.rollout.tail_order import longest_first, probe_order, spread_source
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import run_config, sim_config
from dynaresize.sim.workloads import get_workload


def spec(prompt: int, sample: int) -> RequestSpec:
    return RequestSpec(0, prompt, sample, 0, (1,), 100, prompt * 10 + sample)


# ---------------------------------------------------------------- predictor
def test_prior_until_a_sibling_finishes_then_the_siblings_lead() -> None:
    p = LengthPredictor(prior_tokens=1000.0)
    assert p.estimate(0, 0.0) == pytest.approx(1000.0)
    for s, n in enumerate((4000, 5000)):
        p.finished((0, s), n, 1.0)
    for s, n in enumerate((100, 120)):
        p.finished((1, s), n, 1.0)
    long_group, short_group, unseen = p.estimate(0, 1.0), p.estimate(1, 1.0), p.estimate(2, 1.0)
    assert long_group > unseen > short_group
    assert long_group >= 5000  # never below the longest finished sibling
    # unseen groups: the run's geometric mean, not the initial prior any more
    assert unseen == pytest.approx(math.exp((math.log(4000 * 5000 * 100 * 120)) / 4))


def test_exported_progress_is_a_lower_bound() -> None:
    p = LengthPredictor(prior_tokens=1000.0)
    p.progressed((3, 1), 9000)
    assert p.estimate(3, 0.0) == 9000


def test_a_group_still_running_after_long_is_predicted_long() -> None:
    p = LengthPredictor(prior_tokens=1000.0)
    p.dispatched((0, 0), 0.0)
    p.dispatched((1, 0), 0.0)
    p.finished((1, 0), 500, 10.0)  # 50 tokens/s per request
    p.dispatched((2, 0), 90.0)
    assert p.tokens_per_s == pytest.approx(50.0)
    # group 0's request has decoded for 100 s: at least ~5000 tokens; group 2's for 10 s
    assert p.estimate(0, 100.0) == pytest.approx(5000.0)
    assert p.estimate(2, 100.0) == pytest.approx(500.0)


# ---------------------------------------------------------------- order and placement
def test_probe_order_starts_one_sample_of_every_group() -> None:
    fifo = [spec(p, s) for p in range(3) for s in range(3)]
    assert [(w.prompt, w.sample) for w in probe_order(fifo)] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2)]


def test_longest_first_keeps_migrated_work_in_front() -> None:
    moved = InflightRequest(spec(9, 0), [1, 2])
    queue = [spec(0, 1), moved, spec(1, 1), spec(2, 1), spec(2, 2), spec(1, 2), spec(3, 1)]
    est = {0: 100.0, 1: 5000.0, 2: 800.0, 3: 800.0}
    out = longest_first(queue, est.__getitem__)
    assert out[0] is moved
    assert [(w.prompt, w.sample) for w in out[1:]] == [  # type: ignore[union-attr]
        (1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (0, 1)]  # group after group


def test_spread_source_needs_an_idle_engine_and_a_crowded_one() -> None:
    assert spread_source({0: 5, 1: 0, 2: 3}, 2) == 0
    assert spread_source({0: 5, 1: 1, 2: 3}, 2) is None  # nobody idle
    assert spread_source({0: 1, 1: 0}, 2) is None  # one request: nothing to spread
    assert spread_source({0: 3, 1: 0}, 4) is None
    assert spread_source({0: 0}, 2) is None


def test_placement_deals_long_requests_evenly() -> None:
    """Engines above the mean predicted work take the shortest queued request."""
    from collections import deque

    from dynaresize.protocols import RealClock
    from dynaresize.rollout.tail_order import TailOrder

    tail = TailOrder(RealClock(), 4, spread=False)
    queue = deque(tail.first_order([spec(p, 0) for p in range(4)]))
    est = {0: 9000.0, 1: 8000.0, 2: 100.0, 3: 50.0}
    tail.estimate = est.__getitem__
    tail.resort(queue, force=True)  # longest first: 0, 1, 2, 3
    got = [tail.take(queue, 0), tail.take(queue, 1), tail.take(queue, 0), tail.take(queue, 1)]
    prompts = [w.prompt for w in got]  # type: ignore[union-attr]

    # engine 0 took the longest (9000 > mean): next it gets the shortest, not prompt 1
    assert prompts == [0, 1, 3, 2]


def test_tail_policy_is_validated() -> None:
    cfg = Config()
    cfg.rollout.tail_policy = "fastest"
    with pytest.raises(ConfigError, match="rollout.tail_policy"):
        validate(cfg, check_machine=False)


# ---------------------------------------------------------------- twin: semantics unchanged
def _records(policy: str, staleness: int, out: Path) -> tuple[list[tuple], int, list[int]]:
    wl = get_workload("dapo-7b", seed=3, prompts_per_step=24, samples_per_prompt=8)
    costs = get_cost_model("h100-7b")
    cfg = sim_config(wl, 4, 2, 3, staleness, 3, costs)
    cfg.rollout.tail_policy = policy
    run = run_config(cfg, wl, costs, out_dir=out)
    lines = (out / "samples.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert run.orchestrator is not None
    recs.sort(key=lambda r: (r["step"], r["prompt"], r["sample"]))
    return [(r["step"], r["prompt"], r["sample"], r["version"], r["response_tokens"],
             r["tokens_sha256"], r["finish_reason"]) for r in recs], \
        run.orchestrator.rollout.num_migrated, [r["device"] for r in recs]


@pytest.mark.parametrize("staleness", [0, 1])
def test_twin_same_samples_with_the_tail_policy_on(staleness: int, tmp_path: Path) -> None:
    off, _, off_devices = _records("off", staleness, tmp_path / "off")
    keys = [r[:3] for r in off]
    assert len(keys) == len(set(keys)) == 3 * 24 * 8
    for policy in ("order", "spread"):
        on, migrated, devices = _records(policy, staleness, tmp_path / policy)
        assert on == off
        assert devices != off_devices  # the policy did place requests differently
        if policy == "spread" and staleness == 0:
            assert migrated > 0  # the test exercises spreading's migrations
