"""Workload presets (determinism, tail statistics, correlation) and trace validation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynaresize.sim.traces import load_trace, parse_trace_lines, write_trace
from dynaresize.sim.workloads import PRESETS, get_workload


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_deterministic_in_seed_and_step(name: str) -> None:
    a, b = get_workload(name, seed=3), get_workload(name, seed=3)
    assert a.requests(2) == b.requests(2)
    assert not np.array_equal(a.step_requests(2).response_tokens,
                              get_workload(name, seed=4).step_requests(2).response_tokens)
    # any order of steps gives the same numbers
    later = a.step_requests(7).response_tokens.copy()
    assert np.array_equal(get_workload(name, seed=3).step_requests(7).response_tokens, later)


def test_request_dict_shape() -> None:
    rows = get_workload("balanced", prompts_per_step=2, samples_per_prompt=3).requests(5)
    assert len(rows) == 6
    assert set(rows[0]) == {"step", "prompt", "sample", "response_tokens", "prompt_tokens"}
    assert rows[0]["step"] == 5 and rows[-1]["prompt"] == 1 and rows[-1]["sample"] == 2


def test_dapo_tail_statistics() -> None:
    wl = get_workload("dapo-7b")
    r = wl.step_requests(0).response_tokens
    assert r.shape == (512, 16)
    median = np.median(r)
    assert 7.0 <= np.percentile(r, 99) / median <= 12.0
    assert 0.01 <= np.mean(r >= 16384) <= 0.06
    assert r.max() == 16384
    later = wl.step_requests(49).response_tokens
    assert np.median(later) > 1.4 * median  # drifting upward


def test_group_correlation() -> None:
    r = np.log(get_workload("dapo-7b").step_requests(0).response_tokens)
    corr = np.corrcoef(r[:, 0], r[:, 1])[0, 1]
    assert 0.3 < corr < 0.7


def test_balanced_has_no_tail_and_drift_doubles() -> None:
    r = get_workload("balanced").step_requests(0).response_tokens
    assert np.percentile(r, 99) / np.median(r) < 2.0
    drift = get_workload("drift")
    m0 = np.median(drift.step_requests(0).response_tokens)
    m25 = np.median(drift.step_requests(25).response_tokens)
    assert 1.6 < m25 / m0 < 2.5


def test_agentic_is_bimodal_with_long_prompts() -> None:
    req = get_workload("agentic").step_requests(0)
    assert np.median(req.prompt_tokens) > 2000
    logs = np.log(req.response_tokens.ravel())
    short, long_ = np.mean(logs < np.log(1000)), np.mean(logs > np.log(2000))
    assert short > 0.3 and long_ > 0.2


def test_scaling_requests_per_step() -> None:
    wl = get_workload("dapo-7b", requests_per_step=8192)
    assert wl.step_requests(0).num_requests == 8192
    with pytest.raises(ValueError, match="multiple"):
        get_workload("dapo-7b", requests_per_step=100)
    with pytest.raises(ValueError, match="allowed"):
        get_workload("nope")


def test_trace_round_trip(tmp_path: Path) -> None:
    wl = get_workload("agentic", prompts_per_step=3, samples_per_prompt=2)
    path = tmp_path / "t.jsonl"
    write_trace(wl, 2, str(path))
    tr = load_trace(str(path))
    assert tr.num_steps == 2 and tr.prompts_per_step == 3 and tr.samples_per_prompt == 2
    assert tr.requests(1) == wl.requests(1)


GOOD = {"step": 0, "prompt": 0, "sample": 0, "response_tokens": 5, "prompt_tokens": 3}


def _line(**changes: object) -> str:
    row = {**GOOD, **changes}
    return json.dumps({k: v for k, v in row.items() if v is not ...})


@pytest.mark.parametrize(("bad", "match"), [
    (_line(response_tokens=...), "line 2: missing field 'response_tokens'"),
    (_line(prompt="a"), "line 2: field 'prompt' = 'a': must be an integer"),
    (_line(sample=1.5), "line 2: field 'sample'"),
    (_line(step=True), "line 2: field 'step'"),
    (_line(prompt_tokens=-1), "line 2: field 'prompt_tokens' = -1: must be >= 0"),
    (_line(), r"line 2: duplicate \(step, prompt, sample\)"),
    ("{not json", "line 2: not valid JSON"),
    ("[1, 2]", "line 2: expected a JSON object"),
])
def test_trace_errors_name_file_line_and_field(tmp_path: Path, bad: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_line() + "\n" + bad + "\n")
    with pytest.raises(ValueError, match=match) as info:
        load_trace(str(path))
    assert str(path) in str(info.value)


def test_trace_incomplete_grid_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "gap.jsonl"
    path.write_text(_line() + "\n" + _line(prompt=1, sample=1) + "\n")
    with pytest.raises(ValueError, match="lacks prompt 0 sample 1"):
        load_trace(str(path))
    with pytest.raises(ValueError, match="cannot read"):
        load_trace(str(tmp_path / "missing.jsonl"))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.text(max_size=40),
    st.dictionaries(st.sampled_from(list(GOOD) + ["x"]),
                    st.one_of(st.integers(-3, 3), st.floats(), st.text(max_size=3),
                              st.none(), st.booleans()),
                    max_size=6).map(json.dumps),
), max_size=5))
def test_trace_parser_only_raises_value_error(lines: list[str]) -> None:
    try:
        parse_trace_lines(lines, "prop.jsonl")
    except ValueError as exc:
        assert "prop.jsonl" in str(exc)
