"""The optimizer-step boundary: the train lock, held by a training step (or a streamed
training session) and by a resize, so a training group never changes inside a step.

A resize announces itself (`resizes_waiting`, and `changed` is set) before it queues for the
lock: streaming training then ends its session between micro-batches and yields. The
boundary is the only writer of the lock and of the count of waiting resizes."""

from __future__ import annotations

import asyncio


class OptimizerBoundary:
    def __init__(self, changed: asyncio.Event) -> None:
        self.lock = asyncio.Lock()
        """Held by a training round or step and by a resize."""
        self.resizes_waiting = 0
        """Resizes queued for the lock: streaming training yields to them."""
        self._changed = changed

    def busy(self) -> bool:
        return self.lock.locked()

    def resize_waits(self) -> bool:
        return self.resizes_waiting > 0

    async def acquire_for_resize(self) -> None:
        """Queue for the lock as a resize (streaming training is told to yield)."""
        self.resizes_waiting += 1
        self._changed.set()
        try:
            await self.lock.acquire()
        finally:
            self.resizes_waiting -= 1

    def release(self) -> None:
        self.lock.release()
