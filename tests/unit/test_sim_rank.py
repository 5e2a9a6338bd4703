"""SimRank: a simulated device's training state refuses what the live trainer refuses."""

from __future__ import annotations

import pytest

from dynaresize.sim.rank import SimRank


def test_join_starts_from_step_zero_and_caches_the_group() -> None:
    rank = SimRank(2)
    assert rank.join((3, 2)) == (True, False)
    assert rank.members == (2, 3) and rank.steps == 0
    assert rank.join((2, 3)) == (True, True)  # the communicator is cached
    assert SimRank(5).join((2, 3)) == (False, False)


def test_a_reshard_hands_the_state_to_new_members_at_commit() -> None:
    old, new = SimRank(0), SimRank(1)
    old.join((0,))
    old.stepped(0), old.stepped(1)
    old.prepare((1,), optimizer_step=2)
    new.prepare((1,), optimizer_step=2)
    assert new.steps is None  # not before the commit
    assert not old.commit((1,)) and old.steps is None and old.members == ()
    assert new.commit((1,)) and new.steps == 2 and new.members == (1,)


def test_an_old_member_on_the_wrong_state_fails_the_reshard() -> None:
    rank = SimRank(0)
    rank.join((0,))
    with pytest.raises(RuntimeError, match="after 3 optimizer steps; this rank holds 0"):
        rank.prepare((0, 1), optimizer_step=3)


def test_an_aborted_reshard_keeps_the_old_layout() -> None:
    rank = SimRank(1)
    rank.prepare((1,), optimizer_step=4)
    rank.abort()
    assert rank.commit((1,)) and rank.steps is None  # without the abort: 4


def test_held_gradients_block_a_whole_step_and_a_rebuild_drops_them() -> None:
    rank = SimRank(0)
    rank.join((0, 1))
    rank.hold(0)
    with pytest.raises(ValueError, match="gradients of step 0 are held"):
        rank.start_step(0)
    assert rank.rebuild((0, 1), optimizer_step=0, keep_train_state=True)  # nobody lost
    with pytest.raises(ValueError, match="dropped by a world rebuild"):
        rank.start_finish(0)
    rank.start_step(0)  # a rerun of the step as a whole is fine


def test_kept_state_fits_only_the_group_it_was_sharded_for() -> None:
    """Live, a kept shard is the rows of its rank in the old group: restoring it into another
    group fails (a size mismatch) or, at the same size, puts rows on the wrong rank."""
    rank = SimRank(0)
    rank.join((0, 1, 2))
    with pytest.raises(RuntimeError, match=r"shards of group \(0, 1, 2\) for group \(0, 1\)"):
        rank.rebuild((0, 1), optimizer_step=0, keep_train_state=True)


def test_a_rebuild_without_the_state_starts_over_and_drops_non_members() -> None:
    rank, gone = SimRank(0), SimRank(1)
    for r in (rank, gone):
        r.join((0, 1))
        r.stepped(0)
    assert rank.rebuild((0,), optimizer_step=5, keep_train_state=False) and rank.steps == 0
    assert not gone.rebuild((0,), optimizer_step=1, keep_train_state=True)
    assert gone.steps is None and gone.members == ()
    rank.restored(5)
    assert rank.steps == 5
