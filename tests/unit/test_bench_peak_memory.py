"""bench/peak_memory.py on this process and a short child (Linux /proc; milliseconds)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from peak_memory import main, pss_parts, sample, trace_line  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(),
                                reason="needs Linux /proc/PID/smaps_rollup")


def test_pss_parts_add_up_and_a_gone_process_has_none() -> None:
    parts = pss_parts(os.getpid())
    assert parts["pss"] > 0
    assert abs(parts["anon"] + parts["file"] + parts["shmem"] - parts["pss"]) <= 64 * 1024
    assert parts["rss"] >= parts["pss"]
    assert pss_parts(2**22 + 1) == {}  # above Linux's pid limit: no such process


def test_a_sample_names_the_root_driver_and_its_trace_line_holds_the_parts() -> None:
    parts: dict[str, dict[str, float]] = {}
    now = sample(os.getpid(), parts)
    assert now["driver"] > 0 and now["total"] >= now["driver"]
    assert now["rss_sum"] >= now["total"] - 1e-9  # RSS counts shared pages in full
    line = json.loads(trace_line(1.25, now, parts))
    assert line["t_s"] == 1.2 or line["t_s"] == 1.3  # rounded to 0.1 s
    assert set(line["parts"]["driver"]) == {"anon", "file", "shmem", "rss"}


def test_main_measures_a_command_and_writes_its_trace(tmp_path: Path) -> None:
    out, trace = tmp_path / "peak.json", tmp_path / "trace.jsonl"
    rc = main(["--every-s", "0.05", "--json", str(out), "--trace", str(trace), "--",
               sys.executable, "-c", "import time; b = bytearray(64 << 20); time.sleep(0.5)"])
    result = json.loads(out.read_text())
    assert rc == 0 and result["rc"] == 0
    assert result["peak_total_gib"] >= 0.06  # the child's 64 MiB, touched
    assert 0 < result["peak_t_s"] <= result["wall_s"]
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(lines) >= 2 and max(x["total"] for x in lines) == result["peak_total_gib"]
