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


def test_the_summary_names_the_tail_and_the_acceptance_only_where_the_run_has_them() -> None:
    from dynaresize.app.report import tail_lines

    metrics = [{"tail_tokens_per_s": 10.0}, {"tail_tokens_per_s": 20.0}, {}]
    spec = {"speculation": {"tokens_per_forward": 1.5, "accepted_tokens": 9,
                            "draft_tokens": 20}}
    tail, acceptance = tail_lines(metrics, spec)
    assert "15.00 tokens/s on average over 2 steps (slowest step 10.00)" in tail
    assert "1.50 tokens per forward" in acceptance and "9 of 20" in acceptance
    assert tail_lines([{}], {"speculation": {"tokens_per_forward": None}}) == []
