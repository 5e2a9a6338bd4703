"""`controller.policy = "fixed"`: a split that never changes, with streaming training and (at
staleness >= 1) pipelined rollouts.

What a user can configure by hand without any controller: the best fixed split plus the two
overlaps the orchestrator offers any streaming policy (`controller.stream_training`: train a
step's micro-batches as their groups complete; `controller.pipeline_rollouts`: start the next
rollout on the engines the tail has emptied). The twin's `reference` row is this policy at its
best split (searched), the non-clairvoyant yardstick next to the `oracle` bound.
"""

from __future__ import annotations

from dynaresize.config import Config
from dynaresize.control.base import Controller, Move, RunView


class FixedSplit(Controller):
    """Never resizes; asks for streaming training."""

    streams_training = True
    needs_progress = False
    """No `on_rollout_progress` calls needed (the orchestrator may skip them)."""

    @classmethod
    def build(cls, cfg: Config) -> FixedSplit:
        """`controller.policy = "fixed"`."""
        return cls()

    def at_step_start(self, view: RunView) -> list[Move]:
        return []

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        return []

    def at_rollout_end(self, view: RunView) -> list[Move]:
        return []
