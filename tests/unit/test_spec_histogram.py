"""The live acceptance histogram the twin calibrates from (bench/speculative.py writes it,
sim/speculation.py reads it): accepted tokens per iteration over every forward."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from speculative import add_histogram, per_iteration  # noqa: E402

from dynaresize.sim.speculation import load_acceptance  # noqa: E402


def test_per_iteration_counts_forwards_without_a_draft_as_one_token() -> None:
    # 10 forwards, 4 of them verified drafts: 0, 0, 1 and 3 accepted
    assert per_iteration({0: 2, 1: 1, 3: 1}, 4, 10) == {1: 8, 2: 1, 4: 1}
    with pytest.raises(ValueError, match="inconsistent"):
        per_iteration({0: 2}, 4, 10)
    with pytest.raises(ValueError, match="inconsistent"):
        per_iteration({0: 4}, 4, 3)


def test_the_histogram_from_a_files_own_counts_keeps_its_tokens_per_forward() -> None:
    data = {"tokens_per_forward": {"on": 1.1}, "accepted_tokens": 6, "verify_iterations": 5,
            "accepted_histogram": {"0": 1, "1": 2, "2": 2}}
    got = add_histogram(data)
    assert got["forwards_on"] == 60 and got["accepted_per_iteration"] == {1: 56, 2: 2, 3: 2}
    tokens = sum(a * n for a, n in got["accepted_per_iteration"].items())
    assert tokens / got["forwards_on"] == pytest.approx(1.1)


def test_the_twin_reads_the_checked_in_histogram() -> None:
    path = ROOT / "docs" / "data" / "spec_acceptance.json"
    data = json.loads(path.read_text())
    spec = load_acceptance(path)
    assert spec.mean_accepted == pytest.approx(data["tokens_per_forward"]["on"])
