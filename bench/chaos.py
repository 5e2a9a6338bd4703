"""The twin's chaos campaign: random device deaths at 1024 simulated GPUs, each trial checked
against the fault-free run of its variant (`dynaresize.sim.chaos`).

    python bench/chaos.py [--trials 300] [--first-seed 0] [--hangs P] [--json FILE]
                          [--write docs/results.md]

Each trial draws (from its seed) a variant (policy static/hysteresis, staleness 0/1/2,
checkpoint every 0/1/2 steps, a forced resize or none; 4 steps of dapo-7b, 64 prompts x 4) and
1-3 deaths: the phase (rollout, streamed training, optimizer step, weight sync, resize op,
checkpoint save), the n-th call of that phase's device ops, a delay, the victim; a second or
third death at the same instant, inside the first one's recovery, or later. One process, one
core; recovery seconds are virtual (the modelled H100 costs). `--hangs P`: each death is a
freeze with probability P (nothing the device runs finishes, its group's collectives wait),
killed `faults.hang_timeout_s` (30 s) later as the live watchdog does; its table goes between
the twin-chaos-hangs markers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--json", help="write every trial's row to this file")
    parser.add_argument("--hangs", type=float, default=0.0, metavar="P",
                        help="each death a freeze with probability P (0..1)")
    parser.add_argument("--write", help="put the table between the twin-chaos markers here")
    args = parser.parse_args(argv)
    if not 0.0 <= args.hangs <= 1.0:
        parser.error(f"--hangs {args.hangs}: must be in 0..1")

    from dynaresize.sim.chaos_campaign import Campaign, markdown, write_block

    campaign, rows = Campaign(args.hangs), []
    cpu0 = time.process_time()
    for seed in range(args.first_seed, args.first_seed + args.trials):
        row = campaign.trial(seed)
        rows.append(row)
        if not row["survived"]:
            print(f"trial {seed} FAILED: {json.dumps(row)[:600]}", file=sys.stderr)
        if len(rows) % 25 == 0:
            print(f"{len(rows)} trials, {sum(r['survived'] for r in rows)} survived",
                  file=sys.stderr)
    block = markdown(rows, time.process_time() - cpu0, args.hangs)
    print(block)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.write:
        write_block(Path(args.write), block, args.hangs)
    return 0 if all(r["survived"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
