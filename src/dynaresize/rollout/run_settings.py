"""What a `RolloutRun` is built from: its frozen `RunSettings`, the engine pool's view of
engines on their way to it (`Arrivals`), and the dispatch and reporting constants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

DRAIN_SLICES = 100
"""A draining `run_rollout` call lasts at most this many slices."""
BULK_MIN_FREE = 16
"""A long queue goes out in bulk (`SlotTable.deal_bulk`, O(devices log devices)) only when at
least this many devices may take work; after a completion or two the greedy heap is cheaper."""
PROGRESS_FRACTION = 0.01
"""`on_completions` gets completions in batches of at least this share of the requests in
flight (module docstring); 0: every device return is reported."""


@dataclass(frozen=True)
class RunSettings:
    """How one run serves its requests."""

    version: int
    """The policy version every request of the run needs (an engine joins only once it
    serves it)."""
    max_running: int
    slice_s: float
    light_batch: int = 8
    """Requests per engine below which the run counts as in its tail (`light_s`)."""
    pack_batch: int = 0
    """Once handing off: keep the run on as few engines as hold its remaining requests at
    `pack_batch` each (`rollout.handoff`; 0: engines leave only when empty)."""
    tail_order: bool = False
    """`rollout.tail_policy` on: dispatch order by predicted length (`TailOrder`); else FIFO."""
    spread: bool = False
    """With `tail_order`: spread the thin tail (rollout/tail_order.py)."""
    share_factor: int = 1
    """A pipelined run (`Arrivals`): until it hands off, an engine holds at most this many
    times its share of the remaining requests (`orchestrator.pipeline.share_factor`)."""


class Arrivals(Protocol):
    """Where a pipelined run's engines come from (the engine pool)."""

    def num_rollout_devices(self) -> int:
        """How many engines the run will have once every engine meant for it joined."""
        ...

    def arriving(self) -> set[int]:
        """Engines on their way to the run (loading its version)."""
        ...
