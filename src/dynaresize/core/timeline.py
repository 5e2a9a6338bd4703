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
    busy_kind: dict[str, bool] = {}
    for e in events:
        kind = e["kind"]
        busy = busy_kind.get(kind)
        if busy is None:
            busy = busy_kind[kind] = kind in BUSY_KINDS or kind.startswith("resize.")
        if busy:
            a, b = max(t0, e["t_start"]), min(t1, e["t_end"])
            if b > a:
                intervals = per_device.get(e["device"])
                if intervals is None:
                    intervals = per_device[e["device"]] = []
                intervals.append((a, b))
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


def idle_device_s_per_step(summary: dict[str, Any], events: list[dict[str, Any]],
                           num_steps: int) -> float:
    """Device-seconds per step that no stage used: what could be handed back to the cluster
    (summary.json's bubble fraction x devices seen in `events` x wall time / steps)."""
    num_devices = 1 + max((e["device"] for e in events), default=-1)
    return (summary.get("bubble_fraction", 0.0) * num_devices * summary.get("wall_s", 0.0)
            / max(1, num_steps))


ResizeEntry = tuple[int, str, tuple[int, ...], bool]
"""(resize index, op kind, devices, ok): one op of one resize, or its `resize` summary."""


def resize_sequence(events: list[dict[str, Any]]) -> list[ResizeEntry]:
    """The timing-independent shape of a run's resizes, from events.jsonl records.

    Consumes every `resize.<op>` event and the per-device `resize` summaries; produces one
    entry per (resize index, op kind) with the sorted devices it ran on, and one
    `(index, "resize", moved devices, ok)` per resize; sorted by (index, kind). Live and
    simulated runs of the same forced schedule must give equal lists (acceptance 1): op
    timings differ, the ops, their devices and the moved devices may not."""
    devices: dict[tuple[int, str], set[int]] = {}
    ok: dict[int, bool] = {}
    for e in events:
        kind = e["kind"]
        if kind != "resize" and not kind.startswith("resize."):
            continue
        index = int(e["resize"])
        devices.setdefault((index, kind), set()).add(int(e["device"]))
        if kind == "resize":
            ok[index] = bool(e.get("ok", True))
    return [(index, kind, tuple(sorted(devs)), ok.get(index, True))
            for (index, kind), devs in sorted(devices.items())]


def allocation_sequence(sequence: list[ResizeEntry], num_rollout_devices: int,
                        num_devices: int) -> list[tuple[int, ...]]:
    """The rollout pools a run went through: the initial one (devices 0..R-1), then one per
    successful resize (a moved device switches role). Consumes `resize_sequence` output."""
    pool = set(range(num_rollout_devices))
    out = [tuple(sorted(pool))]
    for index, kind, moved, ok in sequence:
        if kind == "resize" and ok:
            pool ^= set(moved)
            assert pool and len(pool) < num_devices, f"resize {index} empties a pool"
            out.append(tuple(sorted(pool)))
    return out
