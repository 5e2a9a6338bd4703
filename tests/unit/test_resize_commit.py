"""A device dying inside a resize's commit (found by the live chaos campaign, builtin seed
61 of `--hangs 0.5`): the commit is a local swap on every member, so the survivors had
swapped in the new group while the executor, seeing the op fail, rolled back to trainers
that no longer existed; recovery then kept the new group's shards (3 members) and restored
them into the old group's trainers (2): "The size of tensor a (27) must match the size of
tensor b (18)". A commit that some members made is a commit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dynaresize.core.allocation import Allocation
from dynaresize.resize.executor import CommittedResizeError, ResizeExecutor
from dynaresize.resize.planner import plan_resize, target_allocation


class Dead(RuntimeError):
    pass


class FakeDevice:
    def __init__(self, index: int, dies_in_commit: bool) -> None:
        self.index = index
        self.dies_in_commit = dies_in_commit
        self.committed = False

    async def commit_train_group(self, members: tuple[int, ...]) -> None:
        await asyncio.sleep(0)
        if self.dies_in_commit:
            raise Dead(f"device {self.index} died")
        self.committed = True

    async def reshard(self, *args: Any) -> dict[str, float]:
        return {"bytes_sent": 0}

    async def export_inflight(self) -> list[Any]:
        return []

    async def abort_reshard(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:  # every other op: nothing to do
        async def op(*args: Any, **kwargs: Any) -> Any:
            return False
        return op


class Hooks:
    async def stop_admission(self, device: Any) -> None:
        return None

    def requeue(self, device: Any, exported: list[Any]) -> None:
        return None

    def start_serving(self, device: Any) -> None:
        return None

    def current_weights(self, for_devices: Any) -> tuple[int, Any]:
        return 0, None


class Clock:
    def now(self) -> float:
        return 0.0


class RunDir:
    def event(self, *args: Any, **kwargs: Any) -> None:
        return None


@pytest.mark.parametrize("who_dies", [(1,), (1, 2, 3)])
def test_a_death_in_the_commit_is_after_the_commit_if_anyone_committed(
        who_dies: tuple[int, ...]) -> None:
    source = Allocation.initial(2, 2)                       # 0, 1 rollout; 2, 3 train
    target = target_allocation(source, "rollout->train", 1)
    plan = plan_resize(source, target)
    assert plan.to_train == (1,)
    devices = [FakeDevice(i, i in who_dies) for i in range(4)]
    executor = ResizeExecutor(devices, Clock(), RunDir(), Hooks(), 0)  # type: ignore[arg-type]

    async def go() -> Any:
        return await executor.execute(plan, optimizer_step=3)

    if len(who_dies) < 3:                                  # 2 and 3 swapped in the new group
        with pytest.raises(CommittedResizeError):
            asyncio.run(go())
        assert devices[2].committed and devices[3].committed
    else:                                                  # nobody committed: a rollback
        report = asyncio.run(go())
        assert not report.ok and "died" in report.error
