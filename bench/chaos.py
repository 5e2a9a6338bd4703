"""The twin's chaos campaign: random device deaths at 1024 simulated GPUs, each trial checked
against the fault-free run of its variant (`dynaresize.sim.chaos`).

    python bench/chaos.py [--trials 300] [--first-seed 0] [--json FILE] [--write docs/results.md]

Each trial draws (from its seed) a variant (policy static/hysteresis, staleness 0/1,
checkpoint every 0/1/2 steps, a forced resize or none; 4 steps of dapo-7b, 64 prompts x 4) and
1-3 deaths: the phase (rollout, streamed training, optimizer step, weight sync, resize op,
checkpoint save), the n-th call of that phase's device ops, a delay, the victim; a second or
third death at the same instant, inside the first one's recovery, or later. One process, one
core; recovery seconds are virtual (the modelled H100 costs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

START, END = "<!-- twin-chaos:start -->", "<!-- twin-chaos:end -->"
COLS = ["trials", "deaths", "survived", "failed", "lost", "duplicated", "wrong_version",
        "changed", "params_wrong", "final_checkpoint_missing", "recovery_s_median",
        "recovery_s_max", "replayed_steps"]


def markdown(rows: list[dict[str, Any]], cpu_s: float) -> str:
    from dynaresize.sim.chaos_campaign import table

    lines = ["| first death in | " + " | ".join(COLS) + " |", "|---" * (len(COLS) + 1) + "|"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["deaths"][0]["phase"], []).append(r)
        groups.setdefault(f"{len(r['deaths'])} death(s) drawn", []).append(r)
    for name in sorted(groups, key=lambda n: (n[0].isdigit(), n)):
        t = table(groups[name])
        lines.append(f"| {name} | " + " | ".join(str(t[c]) for c in COLS) + " |")
    t = table(rows)
    lines.append("| **all** | " + " | ".join(f"**{t[c]}**" for c in COLS) + " |")
    overlap = sum(any(d["after"] is not None for d in r["deaths"]) for r in rows)
    return "\n".join([
        f"`python bench/chaos.py --trials {len(rows)}` (1024 simulated GPUs, 896 rollout / "
        f"128 train, 4 steps; {cpu_s:.0f} s of CPU on one core, shared machine).",
        "", *lines, "",
        f"{overlap} trials had a death inside the recovery of another. `lost`/`duplicated`/"
        "`wrong_version`/`changed`: samples missing, recorded twice, with another version or "
        "length than the fault-free run of the same variant; `params_wrong`: a surviving "
        "trainer whose state does not hold every step once; `recovery_s`: virtual seconds "
        "per trial (world rebuild + restore + replay), over trials with a recovery."])


def write_block(path: Path, block: str) -> None:
    text = path.read_text()
    if START in text:
        head, rest = text.split(START, 1)
        text = head + START + "\n" + block + "\n" + END + rest.split(END, 1)[1]
    else:
        text += f"\n{START}\n{block}\n{END}\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--json", help="write every trial's row to this file")
    parser.add_argument("--write", help="put the table between the twin-chaos markers here")
    args = parser.parse_args(argv)

    from dynaresize.sim.chaos_campaign import Campaign

    campaign, rows = Campaign(), []
    cpu0 = time.process_time()
    for seed in range(args.first_seed, args.first_seed + args.trials):
        row = campaign.trial(seed)
        rows.append(row)
        if not row["survived"]:
            print(f"trial {seed} FAILED: {json.dumps(row)[:600]}", file=sys.stderr)
        if len(rows) % 25 == 0:
            print(f"{len(rows)} trials, {sum(r['survived'] for r in rows)} survived",
                  file=sys.stderr)
    block = markdown(rows, time.process_time() - cpu0)
    print(block)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.write:
        write_block(Path(args.write), block)
    return 0 if all(r["survived"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
