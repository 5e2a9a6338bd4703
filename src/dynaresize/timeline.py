"""Timeline arithmetic over events.jsonl records (pure): busy intervals, bubble fraction."""

from __future__ import annotations

from typing import Any

BUSY_KINDS = ("rollout", "train", "weight_sync", "load_weights")


def bubble_fraction(events: list[dict[str, Any]], t0: float, t1: float,
                    num_devices: int) -> float:
    """1 − (device-seconds busy in [t0, t1]) / (num_devices × (t1 − t0))."""
    span = t1 - t0
    if span <= 0 or num_devices <= 0:
        return 0.0
    per_device: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e["kind"] in BUSY_KINDS or e["kind"].startswith("resize."):
            a, b = max(t0, e["t_start"]), min(t1, e["t_end"])
            if b > a:
                per_device.setdefault(e["device"], []).append((a, b))
    busy = 0.0
    for intervals in per_device.values():
        intervals.sort()
        cur_a, cur_b = intervals[0]
        for a, b in intervals[1:]:
            if a > cur_b:
                busy += cur_b - cur_a
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        busy += cur_b - cur_a
    return max(0.0, 1.0 - busy / (num_devices * span))
