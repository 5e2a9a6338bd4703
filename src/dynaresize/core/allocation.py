"""The allocation ledger (pure): which role each device holds.

Devices are numbered 0..N-1; the initial allocation gives the first
`allocation.num_rollout_devices` of them to rollout and the rest to training (design §5).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from dynaresize.core.types import Role


@dataclass(frozen=True)
class Allocation:
    roles: tuple[Role, ...]

    @classmethod
    def initial(cls, num_rollout_devices: int, num_train_devices: int) -> Allocation:
        if num_rollout_devices <= 0 or num_train_devices <= 0:
            raise ValueError("both pools need at least one device")
        return cls((Role.ROLLOUT,) * num_rollout_devices + (Role.TRAIN,) * num_train_devices)

    @property
    def num_devices(self) -> int:
        return len(self.roles)

    @cached_property  # the roles never change: computed once (views read it per completion)
    def rollout(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.roles) if r is Role.ROLLOUT)

    @cached_property
    def train(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.roles) if r is Role.TRAIN)

    def with_roles(self, changes: dict[int, Role]) -> Allocation:
        roles = list(self.roles)
        for device, role in changes.items():
            roles[device] = role
        return Allocation(tuple(roles))

    def describe(self) -> str:
        return f"{len(self.rollout)} rollout / {len(self.train)} train"
