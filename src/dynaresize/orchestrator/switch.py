"""Role switches of colocated devices (one device both rolls out and trains, time-shared as a
hybrid engine does): what the loops await before a step's rollout and before its training.
Disaggregated runs (the default) switch nothing (`NoSwitch`)."""

from __future__ import annotations

from typing import Protocol


class RoleSwitch(Protocol):
    async def to_rollout(self, step: int) -> None:
        """Before step `step`'s engines load its version (after its version is published)."""

    async def to_train(self, step: int) -> None:
        """Before step `step`'s training (after its samples are complete)."""


class NoSwitch:
    """Separate rollout and training pools: nothing to switch."""

    async def to_rollout(self, step: int) -> None:
        return None

    async def to_train(self, step: int) -> None:
        return None
