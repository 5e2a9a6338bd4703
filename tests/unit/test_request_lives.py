"""The tail's tokens/s from request lives (pure): which requests form the tail, first
submissions kept across moves."""

from __future__ import annotations

import pytest

from dynaresize.rollout.lives import RequestLives, tail_tokens_per_s


def test_the_tail_is_the_longest_quarter_by_tokens_summed_over_lives() -> None:
    lives = [(10, (0, 0, i), 5.0) for i in range(6)] + [(100, (0, 1, 0), 20.0),
                                                        (60, (0, 1, 1), 40.0)]
    # 8 requests: the 2 longest, 160 tokens over 60 s
    assert tail_tokens_per_s(lives) == pytest.approx(160 / 60)
    assert tail_tokens_per_s(lives, 1.0) == pytest.approx(220 / 90)
    # fewer than four requests: the longest one
    assert tail_tokens_per_s(lives[-2:]) == pytest.approx(100 / 20)


def test_ties_are_broken_by_request_key_and_empty_or_zero_time_gives_none() -> None:
    lives = [(10, (0, 0, 1), 2.0), (10, (0, 0, 0), 5.0), (1, (0, 0, 2), 1.0),
             (1, (0, 0, 3), 1.0)]
    assert tail_tokens_per_s(lives) == pytest.approx(10 / 2.0)  # key (0, 0, 1) sorts last
    assert tail_tokens_per_s([]) is None
    assert tail_tokens_per_s([(5, (0, 0, 0), 0.0)]) is None
    with pytest.raises(ValueError, match="fraction = 0"):
        tail_tokens_per_s(lives, 0)


def test_a_moved_or_rerun_request_keeps_its_first_submission() -> None:
    lives = RequestLives()
    lives.submitted([(0, 0, 0), (0, 0, 1)], 1.0)
    lives.submitted([(0, 0, 0)], 4.0)  # requeued and submitted again elsewhere
    lives.finished((0, 0, 0), 30, 7.0)
    lives.finished((0, 0, 1), 6, 3.0)
    assert sorted(lives.lives) == [(6, (0, 0, 1), 2.0), (30, (0, 0, 0), 6.0)]
    assert lives.tail_tokens_per_s() == pytest.approx(5.0)
    lives.submitted([(0, 0, 0)], 9.0)  # a key finished before starts a new life
    lives.finished((0, 0, 0), 3, 10.0)
    assert lives.lives[-1] == (3, (0, 0, 0), 1.0)
