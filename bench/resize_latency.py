"""Resize latency: our executor's critical path against a naive restart (issue 3, acceptance 2).

    python bench/resize_latency.py                      # tiny + 100M model, table
    python bench/resize_latency.py --models tiny --json

The same code path as `dynaresize bench resize` (same arguments); results are recorded in
docs/resize-benchmark.md.
"""

from __future__ import annotations

import sys

from dynaresize.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "resize", *sys.argv[1:]]))
