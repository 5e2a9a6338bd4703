"""How the pool tells a dead device from a live one when the device is on another machine
(no /proc to read): the cluster's node table and a ping in the actors' control concurrency
group. Simulated on the session pool by treating its devices as remote."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.ray


def test_remote_devices_are_pinged_and_replaced(device_pool: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    pool = device_pool(4)
    monkeypatch.setattr(pool, "_on_this_machine", lambda index: False)
    assert all(pool.is_alive(i) for i in range(4))  # answers from the control group
    ray.kill(pool.actors[3], no_restart=True)       # gone without the pool knowing
    assert not pool.is_alive(3) and pool.is_alive(0)
    old = pool.actors[3]
    assert pool.repair() == [3] and pool.actors[3] is not old
    assert all(pool.is_alive(i) for i in range(4))
    monkeypatch.undo()
    assert all(pool.is_alive(i) for i in range(4)) and pool.repair() == []
