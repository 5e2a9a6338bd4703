"""The report's timeline draws every event kind a run writes (checkpoints and recoveries too)."""

from __future__ import annotations

from pathlib import Path

from dynaresize.app.report import plot_timeline


def test_timeline_draws_checkpoint_recovery_and_fault_events(tmp_path: Path) -> None:
    events = [
        {"t_start": 0.0, "t_end": 1.0, "device": 0, "kind": "rollout", "critical": True},
        {"t_start": 1.0, "t_end": 2.0, "device": 1, "kind": "train", "critical": True},
        {"t_start": 2.0, "t_end": 2.5, "device": 1, "kind": "checkpoint", "critical": True},
        {"t_start": 2.5, "t_end": 2.5, "device": 0, "kind": "fault", "critical": True},
        {"t_start": 2.5, "t_end": 3.0, "device": 1, "kind": "recovery", "critical": True},
        {"t_start": 3.0, "t_end": 3.2, "device": 0, "kind": "resize.join_group",
         "critical": True},
    ]
    plot_timeline(events, tmp_path)
    assert (tmp_path / "timeline.png").stat().st_size > 1000
