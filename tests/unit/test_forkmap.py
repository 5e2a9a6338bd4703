"""`sim.forkmap.fork_map`: forked workers give the items' results in order; errors reach the
caller; one worker runs in this process."""

from __future__ import annotations

import os

import pytest

from dynaresize.sim.forkmap import fork_map


def test_results_in_order_from_worker_processes() -> None:
    here = os.getpid()
    out = fork_map(lambda x: (x * x, os.getpid() != here), [3, 1, 2, 5], 2)
    assert [v for v, _ in out] == [9, 1, 4, 25]
    assert all(forked for _, forked in out)


def test_one_worker_runs_here() -> None:
    here = os.getpid()
    assert fork_map(lambda x: os.getpid(), [1, 2], 1) == [here, here]


def test_an_error_in_a_worker_is_raised_here() -> None:
    def fail(x: int) -> int:
        raise ValueError(f"item {x}")
    with pytest.raises(ValueError, match="item"):
        fork_map(fail, [1, 2], 2)
