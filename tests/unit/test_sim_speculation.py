"""The twin's speculative decoding (`sim.speculation`, `sim.engine_spec`): the distributions,
the verify-iteration cost, records unchanged by it, every policy alike, the CLI switch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dynaresize.cli import main
from dynaresize.core.types import RequestSpec
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.device_types import Lengths
from dynaresize.sim.engine_spec import make_engine
from dynaresize.sim.oracle import spec_alone_s, tail_s
from dynaresize.sim.run import simulate
from dynaresize.sim.speculation import (
    PRESETS,
    Speculation,
    best_level,
    load_acceptance,
    request_iterations,
    resolve_speculation,
)
from dynaresize.sim.workloads import get_workload

DAS = PRESETS["das"]


def test_das_preset_and_moments() -> None:
    assert sum(DAS.probs) == pytest.approx(1.0)
    assert DAS.mean_accepted == pytest.approx((1 - 0.6 ** 8) / 0.4)
    assert DAS.moments(1) == (1.0, 0.0)
    assert DAS.moments(2)[0] == pytest.approx(1.6)


def test_iterations_are_bounded_and_seeded() -> None:
    tokens = np.array([[1.0, 7.0, 300.0, 16384.0]])
    for p in DAS.levels:
        n = request_iterations(DAS, 3, tokens, p)
        assert (n >= np.ceil(tokens / p)).all() and (n <= tokens).all() and (n >= 1).all()
        assert (n == request_iterations(DAS, 3, tokens, p)).all()
    long = request_iterations(DAS, 3, np.full((1, 400), 10000.0), 8)
    assert abs(10000 / long.mean() - DAS.mean_accepted) < 0.05


def test_calibrated_histogram(tmp_path: Path) -> None:
    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"accepted_per_iteration": {"1": 30, "2": 50, "4": 20}}))
    spec = load_acceptance(path)
    assert spec.probs == pytest.approx((0.3, 0.5, 0.0, 0.2))
    assert resolve_speculation(str(path)).mean_accepted == pytest.approx(2.1)
    assert resolve_speculation("off") is None and resolve_speculation("das") is DAS
    for bad in ({"accepted_per_iteration": {"0": 1}}, {"accepted_per_iteration": {}},
                {"x": 1}, {"accepted_per_iteration": {"2": -1}}):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="accepted_per_iteration"):
            load_acceptance(path)
    with pytest.raises(ValueError, match="allowed: off, das"):
        resolve_speculation("nope")


def test_no_speculation_where_verification_costs_more() -> None:
    costs = get_cost_model("h100-7b")
    comp = costs.hot_terms[3]
    assert best_level(DAS, comp, 1, 5e-3, 1e-3) == max(DAS.levels)  # alone: deepest
    assert best_level(DAS, comp, 256, 1e-6, 1e-3) == 1  # compute-bound: none
    never = Speculation("never", (1.0,))
    assert best_level(never, comp, 1, 5e-3, 1e-3) == 1


def test_a_request_alone_takes_the_oracles_speculative_time() -> None:
    wl = get_workload("dapo-7b", seed=0, prompts_per_step=4, samples_per_prompt=2)
    costs = replace(get_cost_model("h100-7b"), speculation=DAS)
    req = wl.step_requests(0)
    prompt, sample = np.unravel_index(np.argmax(spec_alone_s(costs, req)), (4, 2))
    engine = make_engine(0, costs, Lengths(wl))
    engine.submit([RequestSpec(step=0, prompt=int(prompt), sample=int(sample), version=0,
                               prompt_tokens=(1,), max_new_tokens=wl.max_response_tokens,
                               seed=0, temperature=1.0)])
    done, elapsed_s = engine.run(1e9, True, 0)
    assert len(done) == 1 and done[0].num_tokens == req.response_tokens[prompt, sample]
    assert elapsed_s == pytest.approx(tail_s(costs, req), rel=1e-3)
    assert elapsed_s < tail_s(get_cost_model("h100-7b"), req) / 1.5


def _samples(out: Path, policy: str) -> list[dict]:
    rows = [json.loads(x) for x in (out / policy / "samples.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in ("step", "prompt", "sample", "version", "num_tokens")
             if k in r} for r in rows]


@pytest.mark.parametrize("staleness", [0, 1])
def test_records_equal_with_and_without_and_every_policy_alike(tmp_path: Path,
                                                                staleness: int) -> None:
    kw = dict(gpus=6, steps=3, staleness=staleness, requests_per_step=64, split=3)
    off = simulate("dapo-7b", policies=("static", "hysteresis", "colocated", "oracle"),
                   out_dir=tmp_path / "off", **kw)
    on = simulate("dapo-7b", policies=("static", "hysteresis", "colocated", "oracle"),
                  out_dir=tmp_path / "on", speculation="das", **kw)
    assert on["speculation"]["name"] == "das"
    for policy in ("static", "hysteresis", "colocated"):
        assert _samples(tmp_path / "off", policy) == _samples(tmp_path / "on", policy)
    for a, b in zip(off["results"], on["results"]):
        assert b["samples_per_s"] > a["samples_per_s"], a["policy"]
        if a["policy"] != "oracle":
            assert b["accepted_per_iteration"] > 1.0 and "accepted_per_iteration" not in a


def test_cli_switch_and_bad_value(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    small = ["simulate", "--gpus", "6", "--steps", "2", "--requests-per-step", "32",
             "--split", "3", "--policy", "static", "--json"]
    assert main([*small, "--speculation", "das"]) == 0
    assert json.loads(capsys.readouterr().out)["speculation"]["name"] == "das"
    config = tmp_path / "twin.toml"
    config.write_text("[sim]\nspeculation = 'das'\n")
    assert main([*small, "--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out)["speculation"]["name"] == "das"
    assert main([*small, "--speculation", "nope"]) == 2
    err = capsys.readouterr().err
    assert "speculation = 'nope'" in err and "Traceback" not in err


def test_kv_bound_engine_preempts_and_finishes() -> None:
    """h100-32b holds ~24k KV tokens: requests are preempted and readmitted; with speculation
    a request's context grows by its tokens per iteration, and admission must leave room for
    that (it once readmitted a request the next span preempted again, forever)."""
    wl = get_workload("dapo-7b", seed=1, prompts_per_step=16, samples_per_prompt=4,
                      max_response_tokens=8192)
    for spec in (None, DAS):
        costs = replace(get_cost_model("h100-32b"), speculation=spec)
        engine = make_engine(0, costs, Lengths(wl))
        engine.submit([RequestSpec(step=0, prompt=p, sample=j, version=0, prompt_tokens=(1,),
                                   max_new_tokens=8192, seed=0, temperature=1.0)
                       for p in range(16) for j in range(4)])
        done, elapsed_s = engine.run(1e9, True, 0)
        assert len(done) == 64 and elapsed_s > 0
