"""The resize planner is pure: op DAGs, device choice, critical path."""

from __future__ import annotations

import pytest

from dynaresize.core.allocation import Allocation
from dynaresize.core.types import Role
from dynaresize.resize.planner import (
    GROUP,
    choose_devices,
    critical_path_s,
    plan_resize,
    target_allocation,
)


def test_rollout_to_train_ops_and_dependencies() -> None:
    src = Allocation.initial(3, 1)
    plan = plan_resize(src, target_allocation(src, "rollout->train", 1))
    assert plan.to_train == (2,) and plan.to_rollout == ()
    assert plan.old_train == (3,) and plan.new_train == (2, 3)
    by_kind = {op.kind: op for op in plan.ops}
    assert list(by_kind) == ["stop_admission", "export_inflight", "release_kv", "join_group",
                             "reshard", "commit", "release_rollout_weights"]
    assert by_kind["reshard"].deps == (by_kind["join_group"].id, by_kind["release_kv"].id)
    assert by_kind["join_group"].device == GROUP
    assert not by_kind["release_rollout_weights"].critical
    assert all(op.critical for op in plan.ops if op.kind != "release_rollout_weights")


def test_train_to_rollout_prepares_before_commit() -> None:
    src = Allocation.initial(1, 3)
    plan = plan_resize(src, target_allocation(src, "train->rollout", 2))
    assert plan.to_rollout == (1, 2) and plan.new_train == (3,)
    ids = {(op.kind, op.device): op for op in plan.ops}
    commit = ids[("commit", GROUP)]
    assert ids[("alloc_kv", 1)].id in commit.deps and ids[("alloc_kv", 2)].id in commit.deps
    # serving does not wait for the reshard: d's shards stream out while it gets ready
    assert ids[("start_serving", 1)].deps == (ids[("alloc_kv", 1)].id,)
    assert ids[("load_weights", 1)].deps == ()
    assert ids[("reshard", GROUP)].id in commit.deps
    assert ids[("drop_trainer", 2)].deps == (commit.id,)
    assert not ids[("drop_trainer", 2)].critical


def test_ops_are_topologically_ordered() -> None:
    src = Allocation.initial(2, 2)
    for move in ("rollout->train", "train->rollout"):
        plan = plan_resize(src, target_allocation(src, move, 1))
        for op in plan.ops:
            assert all(d < op.id for d in op.deps)


def test_device_choice_is_deterministic_and_refuses_empty_pools() -> None:
    alloc = Allocation((Role.TRAIN, Role.ROLLOUT, Role.ROLLOUT, Role.TRAIN))
    assert choose_devices(alloc, "rollout->train", 1) == (2,)
    assert choose_devices(alloc, "train->rollout", 1) == (0,)
    with pytest.raises(ValueError, match="each pool needs at least 1"):
        choose_devices(alloc, "rollout->train", 2)
    with pytest.raises(ValueError, match="allowed"):
        choose_devices(alloc, "sideways", 1)


def test_critical_path_ignores_deferrable_ops() -> None:
    src = Allocation.initial(2, 2)
    plan = plan_resize(src, target_allocation(src, "rollout->train", 1))
    durations = {op.id: 1.0 for op in plan.ops}
    # stop → export → release_kv → reshard → commit: 5 critical ops in a chain
    assert critical_path_s(plan, durations) == pytest.approx(5.0)
    durations[plan.ops[-1].id] = 100.0  # the deferrable release_rollout_weights
    assert critical_path_s(plan, durations) == pytest.approx(5.0)


def test_no_change_is_an_empty_plan() -> None:
    src = Allocation.initial(2, 2)
    assert plan_resize(src, src).ops == ()


def test_preferred_rollout_devices_leave_first() -> None:
    """Move.idle_first: engines with nothing left to run go first (nothing migrates), then
    the usual highest-index ones; preferences outside the rollout pool are ignored."""
    alloc = Allocation.initial(5, 1)  # rollout 0..4, train 5
    assert choose_devices(alloc, "rollout->train", 2, prefer=(1,)) == (1, 4)
    assert choose_devices(alloc, "rollout->train", 2, prefer=(3, 0, 5)) == (0, 3)
    assert choose_devices(alloc, "rollout->train", 1, prefer=(2, 0)) == (2,)
    assert choose_devices(alloc, "rollout->train", 2, prefer=()) == (3, 4)
