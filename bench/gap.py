"""Where hysteresis's step time goes against the oracle's, step by step (issue 19): one twin
run with every request's submission and completion time recorded, written to
docs/results.md (between `<!-- twin-gap:start -->` and `<!-- twin-gap:end -->`).

    python bench/gap.py                      # dapo-7b, 64 GPUs, 8192 requests, s=1, 10 steps
    python bench/gap.py --gpus 32 --staleness 0 --no-write

Per step: the step's time (between optimizer steps) and the oracle's bound for it; the
longest request's life (first submission to completion) against the same request alone on
an empty device (`prefill + decode_span_s(L, 1, prompt)`, the oracle's tail term) and when
it was submitted (after the step's first request; of the requests of the greatest length,
many at the cap, the one finishing last); the rollout's span (first submission to last
completion; at staleness 1 a step's first requests start during the previous step's tail);
its tail (the last 10% of the step's requests to finish: from the 90th percentile
completion to the last); the time the rollout pool was lightly loaded (at most 8 of the
step's requests per rollout device left, the scheduler's `light_batch`, to the last
completion); and the training left after the rollout (last completion to the end of the
step's weight sync). Under each table: the device-seconds per step rollout and training
held, against the oracle's work terms (rollout at full batch, training at data-parallel
efficiency 1).

Completion times are those at which `run_rollout` handed the completion back: exact while
the scheduler watches progress, the end of the call for a draining one (it returns every
completion at once when the engine is empty, which for an engine's last request is its
completion time). The twin's recording hook (`sim.device.RolloutRecorder`) sees
`SimDevice.submit` / `run_rollout` only; the run itself is the unchanged twin.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dynaresize.control.registry import POLICIES
from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import run_config, sim_config
from dynaresize.sim.oracle import oracle_steps
from dynaresize.sim.resolve import resolve_workload
from dynaresize.sim.run import search_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policies import write_block  # noqa: E402  (bench/ is not a package)

START, END = "<!-- twin-gap:start -->", "<!-- twin-gap:end -->"
LIGHT_BATCH = 8
"""Requests per rollout device below which a rollout counts as lightly loaded (the
scheduler's `light_batch`, hysteresis's `tail_batch` default)."""


class Requests:
    """Every request's first submission and its completion (virtual s, tokens): the twin's
    `RolloutRecorder` (`run_config(..., recorder=)`)."""

    def __init__(self) -> None:
        self.submitted: dict[tuple[int, int, int], float] = {}
        self.finished: dict[tuple[int, int, int], tuple[float, int, int]] = {}
        self.drained = 0
        """Completions handed back by a draining call (time: the call's end)."""

    def submitted_at(self, requests: Sequence[RequestSpec | InflightRequest],
                     now_s: float) -> None:
        for r in requests:
            spec = r.spec if isinstance(r, InflightRequest) else r
            self.submitted.setdefault((spec.step, spec.prompt, spec.sample), now_s)

    def finished_at(self, completions: Sequence[Completion], now_s: float,
                    until_empty: bool) -> None:
        for c in completions:
            self.finished[(c.spec.step, c.spec.prompt, c.spec.sample)] = (
                now_s, c.num_tokens, c.num_prompt_tokens)
        self.drained += len(completions) if until_empty else 0


class Recorder:
    """`Requests` as the twin's recording hook."""

    def __init__(self, log: Requests) -> None:
        self.log = log

    def submitted(self, device: int, requests: Sequence[RequestSpec | InflightRequest],
                  now_s: float) -> None:
        self.log.submitted_at(requests, now_s)

    def finished(self, device: int, completions: Sequence[Completion], now_s: float,
                 until_empty: bool) -> None:
        self.log.finished_at(completions, now_s, until_empty)


def light_s(ends: list[float], num_devices: int, per_device: int = LIGHT_BATCH) -> float:
    """Seconds from the completion that leaves at most `num_devices * per_device` of the
    step's requests unfinished to its last completion (`ends` sorted; pure)."""
    after = max(0, len(ends) - num_devices * per_device - 1)
    return ends[-1] - ends[after]


def step_rows(log: Requests, metrics: list[dict], events: list[dict], costs: Any,
              oracle: list[Any]) -> list[dict[str, float]]:
    """The measures of the module docstring, one dict per step."""
    sync_end = {}
    for e in events:
        if e["kind"] == "weight_sync":
            sync_end[e["step"]] = max(sync_end.get(e["step"], 0.0), e["t_end"])
    rows = []
    for m in metrics:
        k = m["step"]
        keys = [key for key in log.finished if key[0] == k]
        starts = [log.submitted[key] for key in keys]
        ends = sorted(log.finished[key][0] for key in keys)
        # of the longest requests (many reach the cap), the one finishing last
        longest = max(keys, key=lambda key: log.finished[key][1::-1])
        end_s, length, prompt = log.finished[longest]
        alone_s = float(costs.decode_span_s(length, 1, prompt) + costs.prefill_s(1) * prompt)
        rows.append({
            "step": k, "step_s": m["step_s"], "oracle_s": oracle[k].step_s,
            "longest_tokens": length, "longest_s": end_s - log.submitted[longest],
            "longest_start_s": log.submitted[longest] - min(starts),
            "alone_s": alone_s, "rollout_s": ends[-1] - min(starts),
            "tail_s": ends[-1] - ends[int(0.9 * (len(ends) - 1))],
            "light_s": light_s(ends, m["num_rollout_devices"]),
            "train_after_s": sync_end[k] - ends[-1],
            "rollout_devices": m["num_rollout_devices"]})
    return rows


def device_s(events: list[dict], oracle: list[Any], num_steps: int) -> str:
    """Device-seconds per step held by rollout and by training (events), against the
    oracle's work terms (every device at its best efficiency: rollout at full batch)."""
    held = {kind: sum(e["t_end"] - e["t_start"] for e in events if e["kind"] == kind)
            / num_steps for kind in ("rollout", "train")}
    roll = statistics.mean(o.rollout_device_s for o in oracle)
    train = statistics.mean(o.train_device_s for o in oracle)
    return (f"Device-seconds per step: rollout held {held['rollout']:.0f} (the oracle's "
            f"work term {roll:.0f}, {held['rollout'] / roll:.2f}x), training "
            f"{held['train']:.0f} ({train:.0f}, {held['train'] / train:.2f}x).")


def report(rows: list[dict[str, float]], head: str, extra: str = "") -> str:
    """A markdown table of the rows and their means, and a line reading them."""
    cols = ("step_s", "oracle_s", "longest_start_s", "longest_s", "alone_s", "rollout_s",
            "tail_s", "light_s", "train_after_s")
    lines = [head, "", "| step | rollout devices at its end | longest (tokens) | " + " | ".join(
        c.replace("_s", " s").replace("_", " ") for c in cols) + " |",
        "|---|---|---|" + "---|" * len(cols)]
    for r in rows:
        lines.append(f"| {r['step']} | {r['rollout_devices']} | {r['longest_tokens']} | "
                     + " | ".join(f"{r[c]:.1f}" for c in cols) + " |")
    mean = {c: statistics.mean(r[c] for r in rows) for c in cols}
    lines.append("| mean | | | " + " | ".join(f"**{mean[c]:.1f}**" for c in cols) + " |")
    lines += ["", (
        f"Mean step {mean['step_s']:.1f} s against the oracle's {mean['oracle_s']:.1f} s "
        f"({mean['oracle_s'] / mean['step_s']:.2f}x). The longest request starts "
        f"{mean['longest_start_s']:.1f} s after the step's first and lives "
        f"{mean['longest_s']:.1f} s, {mean['longest_s'] / mean['alone_s']:.2f}x its "
        f"{mean['alone_s']:.1f} s alone; the rollout spans {mean['rollout_s']:.1f} s, of "
        f"which the last 10% of requests take {mean['tail_s']:.1f} s "
        f"({mean['tail_s'] / mean['rollout_s']:.0%}) and the pool runs lightly loaded "
        f"(<= {LIGHT_BATCH} requests per device left) {mean['light_s']:.1f} s; training after "
        f"the last completion {mean['train_after_s']:.1f} s. {extra}")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="dapo-7b")
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--requests", type=int, default=8192)
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--policy", default="hysteresis")
    parser.add_argument("--split", type=int, help="start split (default: searched, static)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    wl = resolve_workload(args.workload, seed=0, requests_per_step=args.requests)
    costs = get_cost_model("h100-7b")
    parts = []
    for staleness in args.staleness:
        t0 = time.time()
        split = args.split or search_split(wl, args.gpus, args.steps, staleness, 0, costs)[0]
        cfg = sim_config(wl, split, args.gpus - split, args.steps, staleness, 0, costs)
        cfg.controller.policy = args.policy
        log = Requests()
        run = run_config(cfg, wl, costs, POLICIES[args.policy](cfg), recorder=Recorder(log))
        resizes = np.mean([m["num_resizes"] for m in run.rundir.metrics])
        bubble = run.summary["bubble_fraction"]
        oracle = oracle_steps(costs, wl, args.gpus, args.steps, staleness)
        rows = step_rows(log, run.rundir.metrics, run.rundir.events, costs, oracle)
        parts.append(report(rows, (
            f"`{args.policy}` on {args.workload}, {args.gpus} GPUs, {args.requests} "
            f"requests/step, **staleness {staleness}**, {args.steps} steps, seed 0, h100-7b, "
            f"starting from {split}R/{args.gpus - split}T (the static split searched for "
            f"{args.steps} steps); {resizes:.2f} resizes/step; bubble {bubble:.0%} of the "
            f"device-seconds; {log.drained} of "
            f"{len(log.finished)} completions handed back by draining calls. Measured "
            f"{time.strftime('%Y-%m-%d')} on {platform.machine()}, {time.time() - t0:.0f} s "
            f"wall. Seconds (virtual):"), device_s(run.rundir.events, oracle, args.steps)))
    text = "\n\n".join(["Reproduce: `python bench/gap.py`.", *parts])
    print(text)
    if not args.no_write:
        write_block(START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
