"""How the pool tells a dead device from a live one when the device is on another machine
(no /proc to read): the cluster's node table and a ping in the actors' control concurrency
group. Simulated on the session pool by treating its devices as remote."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.ray
KILL_SETTLE_S = 30.0


def test_remote_devices_are_pinged_and_replaced(device_pool: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    pool = device_pool(4)
    monkeypatch.setattr(pool, "_on_this_machine", lambda index: False)
    try:
        assert all(pool.is_alive(i) for i in range(4))  # answers from the control group
        ray.kill(pool.actors[3], no_restart=True)       # gone without the pool knowing
        # ray.kill is asynchronous: a ping sent at once may still be answered (as a remote
        # device killed a moment ago still can be); it must stop answering soon after
        deadline_s = time.monotonic() + KILL_SETTLE_S
        while pool.is_alive(3) and time.monotonic() < deadline_s:
            time.sleep(0.1)
        assert not pool.is_alive(3) and pool.is_alive(0)
        old = pool.actors[3]
        assert pool.repair() == [3] and pool.actors[3] is not old
        assert all(pool.is_alive(i) for i in range(4))
    finally:  # the session's pool is shared: leave it whole whatever happened above
        monkeypatch.undo()
        pool.repair()
    assert all(pool.is_alive(i) for i in range(4)) and pool.repair() == []
