"""bench/async_steps.py's tables, with and without `reference` (pure, milliseconds)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from async_steps import render  # noqa: E402


def _row(steps: int, hysteresis: float, fully_async: float, **more: float) -> dict:
    return {"workload": "dapo-7b", "gpus": 128, "requests": 8192, "speculation": "das",
            "steps": steps, "hysteresis": hysteresis, "fully-async": fully_async,
            "fully-async-keep-kv": fully_async * 1.25, **more}


def _table(text: str) -> list[list[str]]:
    return [line.strip("|").split("|") for line in text.splitlines() if line.startswith("|")]


def test_large_table_has_no_reference_columns_and_counts_misses_per_length() -> None:
    text = render([_row(8, 90.0, 100.0), _row(20, 96.0, 100.0)], 1.0, large=True)
    table = _table(text)
    assert all(len(cells) == 9 for cells in table)  # header, separator, rows
    assert "reference" not in table[0][4:]
    assert table[2][6].strip() == "0.900" and table[3][6].strip() == "0.960"
    # the KV-kept upper bound on the competitor, and hysteresis against it
    assert [c.strip() for c in table[2][7:]] == ["125.00", "0.720"]
    assert "--large" in text
    assert "- 8 steps: hysteresis / fully-async below 0.95 in 1 of 1 rows (min 0.900)" in text
    assert "- 20 steps: hysteresis / fully-async below 0.95 in 0 of 1 rows (min 0.960)" in text


def test_default_table_keeps_reference_and_its_ratio() -> None:
    text = render([_row(8, 90.0, 100.0, reference=80.0)], 1.0)
    table = _table(text)
    assert all(len(cells) == 11 for cells in table)
    assert table[0][5].strip() == "reference"
    assert [c.strip() for c in table[2][4:]] == ["90.00", "80.00", "100.00", "0.900", "0.800",
                                                 "125.00", "0.720"]
    assert "--large" not in text
