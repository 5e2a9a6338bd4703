"""The private torch.distributed world vLLM starts in (rollout.vllm_world): seen by the
building thread only, with its own group counter (no vLLM needed)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch.distributed.distributed_c10d as c10d

from dynaresize.rollout import vllm_world


@pytest.fixture
def restore_world() -> Iterator[None]:
    saved, count = c10d._world, c10d._world.group_count
    yield
    c10d._world = saved
    c10d._world.group_count = count


def test_private_world_is_per_thread_with_its_own_group_counter(restore_world: None) -> None:
    ours = c10d._world.group_count
    seen_elsewhere: list[int] = []
    with vllm_world.private_world():
        c10d._world.group_count = c10d._world.group_count + 5  # what vLLM's new_group does
        private = c10d._world.group_count
        other = threading.Thread(target=lambda: seen_elsewhere.append(c10d._world.group_count))
        other.start()
        other.join()
        assert c10d._world.default_pg is vllm_world._VLLM_WORLD.default_pg  # vLLM's own
    assert seen_elsewhere == [ours]  # a concurrent reshard keeps the device's counter
    assert c10d._world.group_count == ours
    with vllm_world.private_world():
        assert c10d._world.group_count == private  # kept for the process's next engine
