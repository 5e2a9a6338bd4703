"""The private torch.distributed world vLLM starts in (rollout.vllm_world): seen by the
building thread only, with its own group counter (no vLLM needed)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

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


GROUPS_SURVIVE = """
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from dynaresize.devices.world import leave_world
from dynaresize.rollout import vllm_world

tmp, timeout = sys.argv[1], timedelta(seconds=30)
with vllm_world.private_world():  # what vLLM's start-up does, in its own world
    dist.init_process_group("gloo", store=dist.FileStore(tmp + "/vllm", 1), rank=0,
                            world_size=1, timeout=timeout)
    vllm_group = dist.new_group(ranks=[0])
for k in range(2):  # the device's world, formed and left (a rebuild), twice
    dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/w{k}", 1), rank=0,
                            world_size=1, timeout=timeout)
    dist.new_group(ranks=[0])  # the training group
    leave_world()
    assert not dist.is_initialized()
with vllm_world.private_world():  # the next engine's start-up and its collectives
    assert dist.is_initialized()
    dist.new_group(ranks=[0])
    dist.all_reduce(torch.ones(2), group=vllm_group)
    dist.destroy_process_group()
print("ok")
"""


def test_vllm_groups_survive_the_device_world_leaving(tmp_path: Path) -> None:
    """A world rebuild (`devices.world.leave_world`: `destroy_process_group()`) shut down and
    dropped every process group of the process, vLLM's private world's too (the group maps are
    torch module globals): the device's next vLLM engine then failed ("... is not initialized in
    the world group map"). vLLM's groups are kept apart and put back. In a fresh process: an
    earlier in-process vLLM engine (other tests) leaves its world behind in this one."""
    got = subprocess.run([sys.executable, "-c", GROUPS_SURVIVE, str(tmp_path)],
                         capture_output=True, text=True, timeout=180)
    assert got.returncode == 0 and got.stdout.strip() == "ok", got.stderr[-4000:]
