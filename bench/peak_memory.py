"""Peak memory of a command and every process it starts (a `dynaresize train` driver, its Ray
cluster, device actors, evaluation worker): proportional set size (PSS, shared pages split
among their users, so the sum is what the machine holds) from /proc/PID/smaps_rollup, sampled
every `--every-s` seconds over the command's process tree.

    python bench/peak_memory.py [--every-s 0.5] [--json FILE] -- dynaresize train \\
        --config examples/real-arith.toml --out /tmp/m --set run.steps=3

Prints the peak of the total and, at that moment and at each kind's own peak, the PSS per
process kind (device actor, evaluation worker, driver, Ray, other), in GiB. `--trace FILE`:
every sample as a JSON line (seconds since start, GiB per kind, and per kind its anonymous,
file-backed and shared-memory parts: `anon`, `file`, `shmem`), to place the peak in the run
(compare with the run's events.jsonl). Linux only.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from dynaresize.app.driver_kill import proc_stats

GIB = 2**30


def children_map() -> dict[int, list[int]]:
    """parent pid -> child pids, from /proc/*/stat."""
    out: dict[int, list[int]] = defaultdict(list)
    for pid, fields in proc_stats():
        out[int(fields[1])].append(pid)
    return out


def tree(root: int) -> list[int]:
    """`root` and all its descendants alive now."""
    kids, todo, seen = children_map(), [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(kids.get(pid, []))
    return seen


PARTS = {"Pss:": "pss", "Pss_Anon:": "anon", "Pss_File:": "file", "Pss_Shmem:": "shmem",
         "Rss:": "rss"}
"""smaps_rollup lines read. `rss` counts a shared page in every process that maps it (a
template file or the object store in several processes): the sum of RSS overstates."""


def pss_parts(pid: int) -> dict[str, int]:
    """PSS of `pid` in bytes, in all (`pss`) and its anonymous, file-backed and shared-memory
    parts, and its RSS (`rss`) (empty if it is gone)."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key = line.split(maxsplit=1)[0] if line else ""
            if key in PARTS:
                out[PARTS[key]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def pss_bytes(pid: int) -> int:
    """PSS of `pid` (0 if it is gone)."""
    return pss_parts(pid).get("pss", 0)


def kind(pid: int, root: int) -> str:
    """What the process is, from its command line (Ray names its workers by actor class)."""
    if pid == root:
        return "driver"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "gone"
    if "DeviceActor" in cmd:
        return "device actor"
    if "Eval" in cmd:
        return "eval worker"
    if re.search(r"\bray\b|raylet|gcs_server", cmd):
        return "ray"
    return "other"


def sample(root: int, parts: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    """GiB per kind (and 'total') now; `parts`, if given, gets each kind's GiB by part
    (`pss_parts`) and, under "pids", the GiB of each device actor and evaluation worker."""
    by_kind: dict[str, float] = defaultdict(float)
    for pid in tree(root):
        name = kind(pid, root)
        got = pss_parts(pid)
        by_kind[name] += got.get("pss", 0) / GIB
        if parts is not None and name != "gone":
            into = parts.setdefault(name, defaultdict(float))
            for part, num_bytes in got.items():
                into[part] += num_bytes / GIB
            if name in ("device actor", "eval worker"):
                parts.setdefault("pids", {})[str(pid)] = got.get("pss", 0) / GIB
    by_kind["total"] = sum(v for k, v in by_kind.items() if k != "gone")
    by_kind.pop("gone", None)
    if parts is not None:
        by_kind["rss_sum"] = sum(d.get("rss", 0.0) for k, d in parts.items() if k != "pids")
    return dict(by_kind)


def trace_line(t_s: float, now: dict[str, float], parts: dict[str, dict[str, float]]) -> str:
    """One `--trace` line: seconds since start, GiB per kind, and each kind's parts."""
    return json.dumps({"t_s": round(t_s, 1), **{k: round(v, 3) for k, v in sorted(now.items())},
                       "parts": {name: {p: round(v, 3) for p, v in sorted(d.items()) if p != "pss"}
                                 for name, d in sorted(parts.items())}}) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every-s", type=float, default=0.5)
    parser.add_argument("--json")
    parser.add_argument("--trace", help="write every sample to this file (JSON lines)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    proc = subprocess.Popen(command)
    peak: dict[str, float] = {"total": 0.0}
    peak_t_s = 0.0
    kind_peak: dict[str, float] = defaultdict(float)
    num_processes = 0
    t0 = time.monotonic()
    trace = open(args.trace, "w") if args.trace else None  # noqa: SIM115
    while proc.poll() is None:
        parts: dict[str, dict[str, float]] = {}
        now = sample(proc.pid, parts)
        if trace is not None:
            trace.write(trace_line(time.monotonic() - t0, now, parts))
            trace.flush()
        num_processes = max(num_processes, len(now) - 1)
        if now["total"] > peak["total"]:
            peak, peak_t_s = now, time.monotonic() - t0
        for k, v in now.items():
            kind_peak[k] = max(kind_peak[k], v)
        time.sleep(args.every_s)
    if trace is not None:
        trace.close()
    result = {"rc": proc.returncode, "wall_s": round(time.monotonic() - t0, 1),
              "peak_total_gib": round(peak["total"], 3), "peak_t_s": round(peak_t_s, 1),
              "at_peak_gib": {k: round(v, 3) for k, v in sorted(peak.items())},
              "kind_peak_gib": {k: round(v, 3) for k, v in sorted(kind_peak.items())}}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
