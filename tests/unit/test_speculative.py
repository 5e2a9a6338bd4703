"""Drafters and the draft budget of exact speculative decoding (pure, milliseconds)."""

from __future__ import annotations

import pytest

from dynaresize.rollout.spec_stats import SpeculationStats
from dynaresize.rollout.speculative import (
    DraftPool,
    NgramIndex,
    Speculation,
    SpeculationSettings,
    draft_budget,
    predict_remaining,
)


def test_ngram_index_returns_the_most_recent_continuation():
    index = NgramIndex([1, 2, 3, 9, 1, 2, 4, 5], min_n=2, max_n=3)
    assert index.continuation((1, 2), 3) == [4, 5]  # the later occurrence wins
    assert index.continuation((2, 3), 2) == [9, 1]
    assert index.continuation((4, 5), 2) == []  # the suffix itself has no follower yet
    index.extend([1, 2])
    assert index.continuation((4, 5), 2) == [1, 2]


def test_ngram_index_rejects_bad_bounds():
    with pytest.raises(ValueError, match="min_n"):
        NgramIndex([], min_n=0, max_n=2)


def test_prefix_drafter_copies_a_repeated_phrase():
    pool = DraftPool(("prefix",), min_ngram=2, max_ngram=3)
    pool.start((0, 0, 0), (5, 6), [7, 8, 9, 10, 7, 8])
    assert pool.propose((0, 0, 0), 4) == [9, 10, 7, 8]
    assert pool.propose((0, 0, 0), 0) == []


def test_default_drafts_after_any_token_seen_before_longest_match_first():
    # min_ngram defaults to 1 (the most accepted tokens per forward on SmolLM2 responses,
    # bench/drafter_replay.py); a longer match still wins over a single token
    pool = DraftPool(("prefix",))
    assert (pool.min_ngram, pool.max_ngram) == (1, 4)
    assert SpeculationSettings().min_ngram == 1
    pool.start((0, 0, 0), (5, 6), [7, 5])
    assert pool.propose((0, 0, 0), 3) == [6, 7, 5]  # after the one token 5: as at its start
    pool.extend((0, 0, 0), [9, 7, 8, 5])
    assert pool.propose((0, 0, 0), 2) == [9, 7]  # 5 was last followed by 9
    pool.extend((0, 0, 0), [6])  # context ... 8 5 6: the two-token (5, 6) matches the prompt
    assert pool.propose((0, 0, 0), 2) == [7, 5]


def test_sibling_drafter_uses_the_group_but_not_other_prompts():
    pool = DraftPool(("siblings",), min_ngram=2, max_ngram=2)
    pool.start((0, 0, 0), (5, 6), [1, 2, 3, 4])
    pool.start((0, 1, 0), (5, 6), [1, 2, 9, 9])  # another prompt: not a sibling
    pool.start((0, 0, 1), (5, 6), [1, 2])
    assert pool.propose((0, 0, 1), 2) == [3, 4]
    pool.extend((0, 0, 0), [5])
    assert pool.propose((0, 0, 1), 5) == [3, 4, 5]
    # a finished sibling stays a source; its length feeds the prediction
    pool.finish((0, 0, 0), 5)
    assert pool.propose((0, 0, 1), 5) == [3, 4, 5]
    assert pool.finished_lengths((0, 0, 1)) == [5]


def test_history_drafter_remembers_earlier_steps_of_the_same_prompt_bounded():
    pool = DraftPool(("history",), min_ngram=2, max_ngram=2, history_prompts=1,
                     history_responses=2)
    pool.start((0, 3, 0), (5, 6), [1, 2, 3])
    pool.finish((0, 3, 0), 3)
    pool.end_step(1)
    pool.start((1, 8, 0), (5, 6), [1, 2])  # same prompt tokens, later step
    assert pool.propose((1, 8, 0), 3) == [3]
    pool.start((1, 9, 0), (7, 7), [4])
    pool.finish((1, 9, 0), 1)  # another prompt evicts the first (history_prompts = 1)
    pool.start((2, 8, 0), (5, 6), [1, 2])
    assert pool.propose((2, 8, 0), 3) == []


def test_removed_request_is_no_source():
    pool = DraftPool(min_ngram=2, max_ngram=2)
    pool.start((0, 0, 0), (5, 6), [1, 2, 3])
    pool.remove((0, 0, 0))
    pool.start((0, 0, 1), (5, 6), [1, 2])
    # only its own prompt: (1, 2) was never followed
    assert pool.propose((0, 0, 1), 3) == []


def test_unknown_drafter_is_rejected():
    with pytest.raises(ValueError, match="unknown drafters"):
        DraftPool(("oracle",))


def test_budget_is_length_and_load_aware():
    kw = dict(remaining_tokens=100, predicted_remaining=400.0, full_batch=0, long_tokens=0)
    assert draft_budget(7, num_running=30, **kw) == 7  # no full batch: drafts are free
    kw.update(full_batch=8, long_tokens=200)
    assert draft_budget(7, num_running=8, **kw) == 0  # full batch: verification costs more
    assert draft_budget(7, num_running=12, **kw) == 0
    light, busy = draft_budget(7, num_running=1, **kw), draft_budget(7, num_running=6, **kw)
    assert light > busy >= 1
    kw.update(predicted_remaining=20.0)
    assert 1 <= draft_budget(7, num_running=1, **kw) < light  # predicted short: fewer
    kw.update(remaining_tokens=3, predicted_remaining=400.0)
    assert draft_budget(7, num_running=1, **kw) == 2  # never past the length limit
    kw.update(remaining_tokens=1)
    assert draft_budget(7, num_running=1, **kw) == 0


def test_predict_remaining():
    assert predict_remaining(10, [], 100) == 10.0  # long so far: predicted long
    assert predict_remaining(10, [50, 70], 100) == 50.0
    assert predict_remaining(90, [50], 100) == 10.0  # capped by the length limit


def test_speculation_drafts_within_budget_and_counts():
    sp = Speculation(SpeculationSettings(max_draft_tokens=3, min_ngram=1, max_ngram=2))
    sp.pool.start((0, 0, 0), (1,), [2, 3, 4, 5, 2, 3])
    assert sp.drafts((0, 0, 0), num_generated=6, max_new_tokens=100, num_running=1) == [4, 5, 2]
    assert sp.drafts((0, 0, 0), num_generated=6, max_new_tokens=8, num_running=1) == [4]
    stats = SpeculationStats()
    stats.record(3, 2)
    stats.record(3, 0)
    stats.record(2, 2)
    assert (stats.num_verify_iterations, stats.num_draft_tokens, stats.num_accepted_tokens) == (
        3, 8, 4)
    assert stats.accepted_histogram == {2: 2, 0: 1}


def test_groups_of_earlier_steps_are_forgotten_once_finished():
    pool = DraftPool(("siblings",), min_ngram=2, max_ngram=2)
    pool.start((0, 0, 0), (5, 6), [1, 2, 3])
    pool.finish((0, 0, 0), 1)
    pool.start((0, 1, 0), (5, 6), [1, 2, 3])  # still running: its group stays
    pool.start((1, 0, 0), (5, 6), [1, 2])
    assert pool.finished_lengths((0, 0, 1)) == []
    assert pool.propose((0, 1, 0), 1) == []  # only itself in its group
    pool.start((0, 1, 1), (5, 6), [1, 2])
    assert pool.propose((0, 1, 1), 1) == [3]
