"""The balanced plan (`train.balance`): token-budgeted micro-batches, LPT over the ranks."""

from __future__ import annotations

import pickle
import random

import pytest

from dynaresize.core.types import TrainSample
from dynaresize.train.balance import (
    IndexedMicroBatch,
    balanced_plan,
    cut_group,
    lpt_assign,
    rank_tokens,
    token_micro_batches,
)
from dynaresize.train.batching import make_micro_batches, plan_step

GROUP = 4


def samples(lengths: list[list[int]], step: int = 0) -> list[TrainSample]:
    """One group per inner list: response lengths (prompt of 2 tokens)."""
    out = []
    for p, group in enumerate(lengths):
        for j, n in enumerate(group):
            out.append(TrainSample(step, p, j, [1, 2], [3] * n, [-1.0] * n, 0.0, 0.0))
    random.Random(0).shuffle(out)  # the plan sorts
    return out


def test_groups_are_cut_greedily_under_the_budget() -> None:
    assert cut_group([5, 5, 5, 5], 10) == [2, 2]
    assert cut_group([5, 5, 5, 5], 9) == [1, 1, 1, 1]
    assert cut_group([30, 1, 1, 1], 10) == [1, 3]       # a long sample is alone
    assert cut_group([1, 1, 1, 1], 1000) == [4]


def test_partition_and_indices_do_not_depend_on_the_ranks() -> None:
    lengths = [[3, 40, 2, 2], [1, 1, 1, 1], [60, 60, 5, 5]]
    mbs = token_micro_batches(samples(lengths), 50)
    # slot = prompt position x group size + chunk: sparse, in (prompt, chunk) order
    assert [m for m, _ in mbs] == [0, 1, 4, 8, 9, 10]
    assert [[(s.prompt, s.sample) for s in mb] for _, mb in mbs][:2] == \
        [[(0, 0), (0, 1)], [(0, 2), (0, 3)]]   # 5 + 42 tokens, then 4 + 4
    expected = sorted((m, s.prompt, s.sample) for m, mb in mbs for s in mb)
    for num_ranks in (1, 2, 3, 5):
        plan = balanced_plan(samples(lengths), 50, num_ranks)
        assert len(plan) == num_ranks
        assert sorted((mb.global_index, s.prompt, s.sample) for rank in plan
                      for mb in rank if mb for s in mb) == expected


def test_lpt_balances_where_round_robin_does_not() -> None:
    """Tailed groups: round-robin of whole groups leaves one rank with the long ones."""
    rng = random.Random(1)
    lengths = [[int(rng.lognormvariate(6, 1.2)) for _ in range(GROUP)] for _ in range(32)]
    batch = samples(lengths)
    balanced = rank_tokens(balanced_plan(batch, 2048, 4))
    dealt = rank_tokens(plan_step(batch, GROUP, 4))
    assert sum(balanced) == sum(dealt)
    assert max(balanced) < max(dealt)
    assert max(balanced) <= 1.05 * sum(balanced) / 4


def test_lpt_is_deterministic_largest_first_and_pads_rounds() -> None:
    assert lpt_assign([5, 9, 1, 9], 2) == [[1, 0], [3, 2]]     # ties by index, then rank
    plan = balanced_plan(samples([[10, 10, 10, 10], [1, 1, 1, 1]]), 12, 3)
    assert len({len(rank) for rank in plan}) == 1               # equal rounds
    assert sum(mb is None for rank in plan for mb in rank) == 1
    for rank in plan:  # largest first: the ranks' k-th micro-batches are alike (lock-step)
        tokens = rank_tokens([[mb] for mb in rank if mb])
        assert tokens == sorted(tokens, reverse=True)
    with pytest.raises(ValueError):
        lpt_assign([1], 0)


def test_the_default_plan_is_unchanged() -> None:
    batch = samples([[1, 2, 3, 4], [5, 6, 7, 8]])
    plan = plan_step(batch, 2, 3)
    assert [[None if mb is None else [(s.prompt, s.sample) for s in mb] for mb in r]
            for r in plan] == [[[(0, 0), (0, 1)], [(1, 2), (1, 3)]], [[(0, 2), (0, 3)], None],
                               [[(1, 0), (1, 1)], None]]
    assert make_micro_batches(batch, 4)[1][0].prompt == 1


def test_indexed_micro_batches_pickle_with_their_index() -> None:
    mb = IndexedMicroBatch(samples([[1, 2]])[:1], 7)
    back = pickle.loads(pickle.dumps(mb))
    assert back.global_index == 7 and list(back) == list(mb)


def test_twin_samples_count_their_stand_in_lengths() -> None:
    twin = TrainSample(0, 0, 0, [300], [5000], [], 0.0, 0.0)   # the twin's stand-ins
    assert cut_group([300 + 5000], 4096) == [1]
    mbs = token_micro_batches([twin, TrainSample(0, 0, 1, [300], [10], [], 0.0, 0.0)], 4096)
    assert [len(mb) for _, mb in mbs] == [1, 1]
