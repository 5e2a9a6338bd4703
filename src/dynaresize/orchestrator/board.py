"""The step board: what the rollout loop hands the train loop, per step.

The rollout loop posts a step's complete, rewarded samples (`post_samples`) and, with
streaming training, the step's `StepStream` as soon as its run starts (`post_stream`; its
micro-batches become ready as groups complete, each one signalled on `changed`). The train
loop takes them (`samples`, `stream`), says what it holds of the streamed step being trained
(`hold`, what `RunView.train_todo` reads) and clears the step once it is published (`done`).
Writers: the rollout loop posts; the train loop holds and clears.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from dynaresize.core.samples import StepSamples
from dynaresize.core.stream import Holdings, StepStream

T = TypeVar("T")


def _slot(table: dict[int, asyncio.Future[T]], step: int) -> asyncio.Future[T]:
    if step not in table:
        table[step] = asyncio.get_running_loop().create_future()
    return table[step]


class StepBoard:
    def __init__(self) -> None:
        self._samples: dict[int, asyncio.Future[StepSamples]] = {}
        self._streams: dict[int, asyncio.Future[StepStream]] = {}
        self._widths: dict[int, int] = {}
        self._holding: tuple[Holdings, StepStream] | None = None
        self.changed = asyncio.Event()
        """Set when streamed micro-batches become ready, and when a resize starts waiting
        for the optimizer-step boundary (`OptimizerBoundary`): streaming training looks."""

    # ------------------------------------------------------------------ rollout side
    def post_stream(self, step: int, stream: StepStream) -> None:
        _slot(self._streams, step).set_result(stream)

    def post_width(self, step: int, num_rollout_devices: int) -> None:
        """The rollout devices step `step`'s rollout started with (what its bulk ran on)."""
        self._widths[step] = num_rollout_devices

    def post_samples(self, step: int, got: StepSamples) -> None:
        _slot(self._samples, step).set_result(got)

    def posted_stream(self, step: int) -> StepStream | None:
        """Step `step`'s stream if it was posted (streaming), else None."""
        fut = self._streams.get(step)
        return fut.result() if fut is not None and fut.done() else None

    # ------------------------------------------------------------------ train side
    async def stream(self, step: int) -> StepStream:
        return await _slot(self._streams, step)

    async def samples(self, step: int) -> StepSamples:
        return await _slot(self._samples, step)

    def take_width(self, step: int, default: int) -> int:
        return self._widths.pop(step, default)

    def hold(self, holdings: Holdings, stream: StepStream) -> None:
        """The train loop trains this streamed step, holding `holdings` of it."""
        self._holding = (holdings, stream)

    def done(self, step: int) -> None:
        """Step `step` is trained and its version published."""
        del self._samples[step]
        self._streams.pop(step, None)
        self._holding = None

    def train_todo(self) -> float:
        """The share of the streamed step's training not held by any device yet (0 if none)."""
        if self._holding is None or not self._holding[1].num_micro_batches:
            return 0.0
        holdings, stream = self._holding
        return stream.todo_fraction(holdings.held_by)
