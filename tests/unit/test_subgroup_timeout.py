"""Subgroups of the device world (the training group: `DeviceActor.group` through
`devices.world.new_subgroup`) time out after `faults.timeout_s`, as the world does. Without
the timeout torch gives a subgroup its default (30 min for gloo): a collective in the training
group with a dead peer waited that long. Checked on a real gloo world of one rank (this
process; a file store), reading the timeout torch's gloo backend holds."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dynaresize.devices.world import new_subgroup


def backend_timeout(group: dist.ProcessGroup) -> timedelta:
    return group._get_backend(torch.device("cpu")).options._timeout


def test_a_subgroup_times_out_as_the_world_does(tmp_path: Path) -> None:
    if dist.is_initialized():
        pytest.skip("this process already has a torch.distributed world")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1, timeout=timedelta(seconds=7))
    try:
        default = dist.new_group(ranks=[0])
        assert backend_timeout(default) == timedelta(minutes=30)  # what torch does unasked
        group = new_subgroup([0], 7.0)
        assert backend_timeout(group) == timedelta(seconds=7)
        dist.all_reduce(torch.ones(2), group=group)  # a usable group
    finally:
        dist.destroy_process_group()
