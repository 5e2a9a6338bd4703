"""Shared fixtures: one Ray cluster (loopback) and one device pool per size, per test session."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    from dynaresize.devices.ray_device import ray_session

    with ray_session(num_cpus=8):
        yield


@pytest.fixture(scope="session")
def device_pool(ray_cluster: None) -> Iterator[Callable[[int], object]]:
    """`device_pool(n)`: the session's pool of n long-lived device actors (created once)."""
    from dynaresize.devices.pool import DevicePool

    pools: dict[int, DevicePool] = {}

    def get(num_devices: int) -> DevicePool:
        if num_devices not in pools:
            pools[num_devices] = DevicePool(num_devices)
        return pools[num_devices]

    yield get
    for pool in pools.values():
        pool.shutdown()


@pytest.fixture
def group() -> Iterator[object]:
    """A one-rank gloo world in this process (an in-memory store: no socket), its WORLD group;
    destroyed afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
