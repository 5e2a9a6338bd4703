"""Issue 19's acceptance criteria, read off bench/policies.py's table (pure: no simulation).

A record is one row of the table: `{"workload", "requests", "out", ...}` with `out` the
object `simulate` returned (its `gpus`, `staleness`, `results` rows). Tailed workloads are
every one but `balanced`; `balanced` is the tailless one. Each tailed line also gives the min
over the rows in the issue's own range (32-256 GPUs, 512x16 and 4096x16 batches).
"""

from __future__ import annotations

import statistics
from typing import Any

TAILLESS = ("balanced",)
TAILED_TARGETS = {1: {"oracle": 0.75, "static": 1.3, "colocated": 1.3},
                  0: {"oracle": 0.75, "static": 1.3, "colocated": 1.2}}
"""hysteresis / policy, at least, on tailed workloads, per staleness (issue 19, criterion 1)."""
TAILLESS_MIN_RATIO = 0.98
"""hysteresis / static and / colocated, at least, on tailless workloads (criterion 2)."""
TAILLESS_MAX_RESIZES_PER_STEP = 0.1
"""Resizes per step of hysteresis, at most, on tailless workloads (criterion 2)."""
ISSUE_GPUS = (32, 256)
ISSUE_REQUESTS = (8192, 65536)
"""The tailed rows criterion 1 names: 32-256 GPUs, 512x16 and 4096x16 requests per step."""
UNSEEN_MIN_RATIO = 1.0
"""hysteresis / best static, at least, on every unseen run (criterion 3)."""


def _row(record: dict[str, Any], policy: str) -> dict[str, Any]:
    return next((r for r in record["out"]["results"] if r["policy"] == policy), {})


def hyst_ratio(record: dict[str, Any], policy: str) -> float | None:
    """hysteresis's samples/s over `policy`'s in one record; None where either is missing."""
    hyst, other = _row(record, "hysteresis"), _row(record, policy)
    if not hyst or not other.get("samples_per_s"):
        return None
    return hyst["samples_per_s"] / other["samples_per_s"]


def case_name(record: dict[str, Any]) -> str:
    out = record["out"]
    return f"{record['workload']} {out['gpus']} GPUs {record['requests']} req"


def in_issue_range(record: dict[str, Any]) -> bool:
    gpus = record["out"]["gpus"]
    return ISSUE_GPUS[0] <= gpus <= ISSUE_GPUS[1] and record["requests"] in ISSUE_REQUESTS


def _verdict(values: list[tuple[float, str]], target: float, at_least: bool) -> str:
    misses = [v for v in values if (v[0] < target if at_least else v[0] > target)]
    if not misses:
        return "met"
    return f"**missed** by {len(misses)} of {len(values)}"


def acceptance_lines(records: list[dict[str, Any]]) -> list[str]:
    """One line per criterion: the measured min (and median) next to the issue's target."""
    lines = []
    tailed = [r for r in records if r["workload"] not in TAILLESS]
    for staleness, targets in TAILED_TARGETS.items():
        at = [r for r in tailed if r["out"]["staleness"] == staleness]
        for policy, target in targets.items():
            values = sorted((v, case_name(r)) for r in at
                            if (v := hyst_ratio(r, policy)) is not None)
            if not values:
                continue
            median = statistics.median(v for v, _ in values)
            in_range = sorted((v, case_name(r)) for r in at if in_issue_range(r)
                              if (v := hyst_ratio(r, policy)) is not None)
            ranged = (f"; in the issue's range ({len(in_range)} rows) min "
                      f"{in_range[0][0]:.3f}: {_verdict(in_range, target, True)}"
                      if in_range else "")
            lines.append(f"tailed, s={staleness} ({len(values)} rows): hysteresis / {policy} "
                         f"min {values[0][0]:.3f} ({values[0][1]}), median {median:.3f}; "
                         f"target >= {target}x: {_verdict(values, target, True)}{ranged}")
    tailless = [r for r in records if r["workload"] in TAILLESS]
    for policy in ("static", "colocated"):
        values = sorted((v, f"{case_name(r)} s={r['out']['staleness']}") for r in tailless
                        if (v := hyst_ratio(r, policy)) is not None)
        if values:
            lines.append(f"tailless ({len(values)} rows): hysteresis / {policy} min "
                         f"{values[0][0]:.3f} ({values[0][1]}); target >= "
                         f"{TAILLESS_MIN_RATIO}x: "
                         f"{_verdict(values, TAILLESS_MIN_RATIO, True)}")
    resizes = sorted(((_row(r, "hysteresis").get("resizes_per_step", 0.0),
                       f"{case_name(r)} s={r['out']['staleness']}") for r in tailless
                      if _row(r, "hysteresis")), reverse=True)
    if resizes:
        lines.append(f"tailless ({len(resizes)} rows): hysteresis resizes / step max "
                     f"{resizes[0][0]:.2f} ({resizes[0][1]}); target <= "
                     f"{TAILLESS_MAX_RESIZES_PER_STEP}: "
                     f"{_verdict(resizes, TAILLESS_MAX_RESIZES_PER_STEP, False)}")
    return lines


def unseen_line(ratios: list[float]) -> str:
    """How many unseen runs fall below the best static split (criterion 3)."""
    if not ratios:
        return "unseen: no runs"
    below = sum(r < UNSEEN_MIN_RATIO for r in ratios)
    return (f"unseen ({len(ratios)} runs): {below} below {UNSEEN_MIN_RATIO}x the best static "
            f"split (min {min(ratios):.3f}); target: none: "
            f"{'met' if not below else '**missed**'}")


ISSUE25 = {"tail_shorter": 0.35, "hyst_s0_vs_today": 1.25, "hyst_vs_work_bound": 0.85,
           "hyst_vs_fully_async": 0.95}
"""Issue 25's twin targets (acceptance 3): with speculation, the tail span (last 10% of the
requests) at least 35% shorter; hysteresis at staleness 0 at least 1.25x today's (no
speculation); at staleness 2, hysteresis at least 0.85x the oracle's work bound and 0.95x
`fully-async` at the same staleness."""


def _thr(record: dict[str, Any], policy: str, key: str = "samples_per_s") -> float:
    return float(_row(record, policy)[key])


def issue25_lines(records: list[dict[str, Any]]) -> list[str]:
    """One line per (speculation, criterion) from bench/tail_async.py's records (each
    `{"case", "speculation", "staleness", "out", "tail"}`), min over the cases."""
    by = {(r["case"], r["speculation"], r["staleness"]): r for r in records}
    lines = []
    for spec in sorted({r["speculation"] for r in records} - {"off"}):
        tail, s0 = [], []
        for (case, name, staleness), rec in by.items():
            base = by.get((case, "off", staleness))
            if name != spec or staleness != 0 or base is None:
                continue
            label = f"{rec['workload']} {rec['gpus']} GPUs"
            tail.append((1 - rec["tail"]["tail_s"] / base["tail"]["tail_s"], label))
            s0.append((_thr(rec, "hysteresis") / _thr(base, "hysteresis"), label))
        deep = [r for r in records if r["speculation"] == spec and r["staleness"] >= 2]
        work = [(_thr(r, "hysteresis") / _thr(r, "oracle", "work_samples_per_s"),
                 f"{r['workload']} {r['gpus']} GPUs") for r in deep]
        fully = [(_thr(r, "hysteresis") / _thr(r, "fully-async"),
                  f"{r['workload']} {r['gpus']} GPUs") for r in deep]
        for values, what, target in (
                (tail, "tail span shorter than without (s=0, hysteresis)", "tail_shorter"),
                (s0, "hysteresis s=0 / today's (no speculation)", "hyst_s0_vs_today"),
                (work, "s=2: hysteresis / the oracle's work bound", "hyst_vs_work_bound"),
                (fully, "s=2: hysteresis / fully-async (same k)", "hyst_vs_fully_async")):
            if values:
                values.sort()
                lines.append(f"speculation {spec}: {what}: min {values[0][0]:.3f} "
                             f"({values[0][1]}), max {values[-1][0]:.3f}; target >= "
                             f"{ISSUE25[target]}: {_verdict(values, ISSUE25[target], True)}")
    return lines
