"""Reshard planner (pure): the new layout is covered exactly once, from the rows the old owners
hold, in chunks within the staging bound; FSDP2's row split (torch.chunk) is reproduced."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynaresize.resize.reshard import (
    Transfer,
    bytes_by_device,
    max_staged_chunk_bytes,
    plan_reshard,
    row_bytes,
    shard_rows,
    with_optimizer_state,
)

SHAPES = with_optimizer_state({
    "embed": ((32, 64), 4), "gate": ((128, 64), 4), "down": ((64, 128), 4),
    "norm": ((64,), 4), "bias": ((5,), 2), "tiny": ((1, 3), 4), "empty": ((0, 4), 4)})


def chunk_rows(num_rows: int, num_ranks: int) -> list[tuple[int, int]]:
    """What `torch.chunk` (FSDP2's `_chunk_with_empty`) gives each rank, without torch."""
    size = -(-num_rows // num_ranks) if num_rows else 0
    out, start = [], 0
    while start < num_rows:
        out.append((start, min(start + size, num_rows)))
        start += size
    return out + [(num_rows, num_rows)] * (num_ranks - len(out))


def check_plan(plan: list[Transfer], shapes, old, new, staging_bytes: int) -> None:
    """Every row of every tensor in the new layout arrives exactly once, from its old owner, at
    the right local rows, in chunks of at most staging_bytes (or one row)."""
    assert {t.name for t in plan} <= set(shapes)
    for name, (shape, itemsize) in shapes.items():
        num_rows, bytes_per_row = shape[0], row_bytes(shape, itemsize)
        got = [0] * num_rows
        for t in (t for t in plan if t.name == name):
            a, b = t.global_rows
            assert 0 <= a < b <= num_rows
            assert t.num_bytes == (b - a) * bytes_per_row
            assert t.num_bytes <= staging_bytes or b - a == 1
            src_start, src_stop = shard_rows(num_rows, len(old), old.index(t.src_device))
            dst_start, dst_stop = shard_rows(num_rows, len(new), new.index(t.dst_device))
            assert src_start <= a and b <= src_stop  # the source owns these rows
            assert dst_start <= a and b <= dst_stop  # the destination will own them
            assert t.src_local_rows == (a - src_start, b - src_start)
            assert t.dst_local_rows == (a - dst_start, b - dst_start)
            for row in range(a, b):
                got[row] += 1
        expect = 1 if bytes_per_row else 0
        assert got == [expect] * num_rows, name


@pytest.mark.parametrize("num_rows", [0, 1, 2, 5, 7, 64, 129])
@pytest.mark.parametrize("num_ranks", [1, 2, 3, 4, 7])
def test_shard_rows_match_torch_chunk(num_rows: int, num_ranks: int) -> None:
    assert [shard_rows(num_rows, num_ranks, r) for r in range(num_ranks)] == \
        chunk_rows(num_rows, num_ranks)


@pytest.mark.parametrize(("old", "new"), [
    ((0, 1), (0, 1, 2)),      # grow
    ((0, 1, 2), (1, 2)),      # shrink
    ((0, 1), (2, 3)),         # swap members
    ((1,), (0, 2, 3)),        # 1 -> 3
    ((0, 2, 3), (1,)),        # 3 -> 1
    ((0, 1, 2), (0, 1, 2)),   # no change: all local
])
@pytest.mark.parametrize("staging_bytes", [1, 1000, 4096, 1 << 20])
def test_plan_covers_new_layout(old, new, staging_bytes: int) -> None:
    plan = plan_reshard(SHAPES, old, new, staging_bytes)
    check_plan(plan, SHAPES, old, new, staging_bytes)
    assert plan == plan_reshard(dict(reversed(SHAPES.items())), old, new, staging_bytes)


def test_unchanged_group_is_all_local_and_grow_moves_only_what_changes() -> None:
    assert all(t.is_local for t in plan_reshard(SHAPES, (0, 1, 2), (0, 1, 2), 64))
    per_device = bytes_by_device(plan_reshard(SHAPES, (0, 1), (0, 1, 2), 4096))
    total_bytes = sum(row_bytes(s, i) * s[0] for s, i in SHAPES.values())
    moved = sum(d.sent_bytes for d in per_device.values())
    assert moved == sum(d.received_bytes for d in per_device.values())
    assert moved + sum(d.local_copy_bytes for d in per_device.values()) == total_bytes
    assert per_device[2].sent_bytes == 0 and per_device[2].local_copy_bytes == 0
    assert per_device[2].received_bytes > 0 and moved < total_bytes


def test_chunks_bounded_and_several_per_shard() -> None:
    staging_bytes = 1000  # one rank's shard of "gate" under 2 ranks is 16 KiB
    plan = plan_reshard(SHAPES, (0, 1), (2,), staging_bytes)
    gate = [t for t in plan if t.name == "gate" and t.src_device == 0]
    assert len(gate) == -(-64 // 3)  # 3 rows of 256 B per chunk, the last one 1 row
    assert max(t.num_bytes for t in plan) <= staging_bytes
    assert max_staged_chunk_bytes(plan, 2) == 768
    assert max_staged_chunk_bytes(plan, 5) == 0
    # a row larger than the bound still moves, one row per chunk
    one_row = plan_reshard({"w": ((4, 100), 4)}, (0,), (1,), 16)
    assert [t.num_bytes for t in one_row] == [400] * 4


def test_bad_input_refused() -> None:
    with pytest.raises(ValueError, match="staging_bytes"):
        plan_reshard(SHAPES, (0,), (1,), 0)
    with pytest.raises(ValueError, match="new_members is empty"):
        plan_reshard(SHAPES, (0,), (), 10)
    with pytest.raises(ValueError, match="sorted"):
        plan_reshard(SHAPES, (1, 0), (1,), 10)
    with pytest.raises(ValueError, match="scalar"):
        plan_reshard({"s": ((), 4)}, (0,), (1,), 10)


members = st.lists(st.integers(0, 7), min_size=1, max_size=5, unique=True).map(
    lambda m: tuple(sorted(m)))
shapes = st.dictionaries(
    st.text("abcdef", min_size=1, max_size=4),
    st.tuples(st.lists(st.integers(0, 40), min_size=1, max_size=3).map(tuple),
              st.sampled_from([1, 2, 4, 8])),
    min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(shapes=shapes, old=members, new=members, staging_bytes=st.integers(1, 3000))
def test_plan_property(shapes, old, new, staging_bytes: int) -> None:
    plan = plan_reshard(shapes, old, new, staging_bytes)
    check_plan(plan, shapes, old, new, staging_bytes)
    per_device = bytes_by_device(plan)
    assert set(per_device) <= set(old) | set(new)
    for d, b in per_device.items():
        assert b.sent_bytes == 0 or d in old
        assert b.received_bytes == 0 or d in new
    # global order: name order, then global rows; the same on every call
    keys = [(t.name, t.global_rows) for t in plan]
    assert keys == sorted(keys)
