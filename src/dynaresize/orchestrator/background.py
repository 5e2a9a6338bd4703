"""Tasks that run beside the loops (a pipelined step's end, an engine moving between runs):
the first error among them fails the run (`failed`, which the orchestrator awaits with its
loops)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    def __init__(self) -> None:
        self.failed: asyncio.Future[None] | None = None
        """Set with the error of a background task, or None once the loops are done; created
        by `start` (in the running loop)."""

    def start(self) -> asyncio.Future[None]:
        self.failed = asyncio.get_running_loop().create_future()
        return self.failed

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` beside the loops; its error fails the run."""
        def done(task: asyncio.Task[Any]) -> None:
            if not task.cancelled() and task.exception() is not None \
                    and not self.failed.done():  # type: ignore[union-attr]
                self.failed.set_exception(task.exception())  # type: ignore[union-attr]
        task = asyncio.ensure_future(coro)
        task.add_done_callback(done)
        return task

    def finish(self) -> None:
        """The loops are done: nothing failed."""
        assert self.failed is not None
        if not self.failed.done():
            self.failed.set_result(None)
