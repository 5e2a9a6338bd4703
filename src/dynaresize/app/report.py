"""`dynaresize report DIR`: plots and a text summary of a run directory, live or simulated.

Consumes DIR/metrics.jsonl, events.jsonl and summary.json (design §5); produces, in DIR:

- `timeline.png`: devices × time, one bar per event, coloured by role (rollout, train, weight
  sync) and by resize op (`resize.<op>`);
- `utilisation.png`: busy devices over time, per kind of work;
- `stages.png`: rollout, train and step seconds per step, and the allocation;
- `reward.png`: the reward curve (when the run's rewards vary, i.e. a live run);
- `eval.png`: held-out accuracy and reward by policy version (runs with `eval.every`);
- `summary.txt`: the text summary, also printed.

A malformed file raises `UsageError` naming the file and line (exit code 2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from dynaresize.app.report_eval import eval_summary, plot_eval
from dynaresize.cli import UsageError
from dynaresize.core.rundir import EVENT_KEYS, METRIC_KEYS, read_jsonl
from dynaresize.core.timeline import BUSY_KINDS, idle_device_s_per_step
from dynaresize.rollout.spec_stats import acceptance_line

PLOTS = ("timeline.png", "utilisation.png", "stages.png")
OPTIONAL_PLOTS = ("reward.png", "eval.png")
"""Written only when the run has them: rewards that vary (a live run), evaluations."""
COLOURS = {"rollout": "#4C72B0", "train": "#DD8452", "weight_sync": "#55A868",
           "load_weights": "#8FD19E", "start": "#BBBBBB"}
RESIZE_COLOURS = ["#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974",
                  "#64B5CD", "#E377C2", "#7F7F7F", "#BCBD22", "#17BECF", "#D62728"]


def _load(path: Path, name: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Records of DIR/name, each checked for `keys`; UsageError names file and line."""
    file = path / name
    if not file.is_file():
        raise UsageError(f"{file}: missing (is {path} a run directory?)")
    try:
        records = read_jsonl(file)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    line = 0
    for line, record in enumerate(records, 1):
        missing = [k for k in keys if k not in record]
        if missing:
            raise UsageError(f"{file}: record {line}: missing key {missing[0]!r}")
    return records


def load_run(path: str | Path) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """(metrics, events, summary) of a run directory; UsageError if malformed."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{path}: not a directory")
    metrics = _load(path, "metrics.jsonl", METRIC_KEYS)
    events = _load(path, "events.jsonl", EVENT_KEYS)
    summary: dict[str, Any] = {}
    if (path / "summary.json").is_file():
        try:
            summary = json.loads((path / "summary.json").read_text())
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path / 'summary.json'}: line {exc.lineno}: not valid JSON "
                             f"({exc.msg})") from None
    return metrics, events, summary


def _colour(kind: str, other_kinds: list[str]) -> str:
    """A fixed colour for the main kinds; the others (resize ops, checkpoint, recovery, fault)
    cycle through a palette in the order of `other_kinds`."""
    if kind in COLOURS:
        return COLOURS[kind]
    return RESIZE_COLOURS[other_kinds.index(kind) % len(RESIZE_COLOURS)]


def plot_timeline(events: list[dict], out: Path) -> None:
    """timeline.png: one row per device, bars per event kind (resize summaries skipped)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    resize_kinds = sorted({e["kind"] for e in events if e["kind"] not in COLOURS})
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for e in events:
        if e["kind"] != "resize":
            bars.setdefault((e["device"], e["kind"]), []).append(
                (e["t_start"], max(e["t_end"] - e["t_start"], 1e-9)))
    num_devices = 1 + max((d for d, _ in bars), default=0)
    fig, ax = plt.subplots(figsize=(12, min(12, 2 + 0.25 * num_devices)))
    height = 0.8 if num_devices <= 64 else 1.0
    for (device, kind), spans in bars.items():
        ax.broken_barh(spans, (device - height / 2, height), facecolors=_colour(kind, resize_kinds),
                       linewidth=0)
    kinds = sorted({k for _, k in bars}, key=lambda k: (k.startswith("resize."), k))
    ax.legend(handles=[Patch(color=_colour(k, resize_kinds), label=k) for k in kinds],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("device")
    ax.set_title("timeline (devices × time, by role and resize op)")
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=110)
    plt.close(fig)


def utilisation(events: list[dict], num_devices: int, num_bins: int = 400
                ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Busy devices over time per kind: (bin edges, kind → mean busy devices per bin)."""
    busy = [e for e in events if e["kind"] in BUSY_KINDS or e["kind"].startswith("resize.")]
    if not busy:
        return np.zeros(2), {}
    t0 = min(e["t_start"] for e in busy)
    t1 = max(e["t_end"] for e in busy)
    edges = np.linspace(t0, max(t1, t0 + 1e-9), num_bins + 1)
    width = edges[1] - edges[0]
    out: dict[str, np.ndarray] = {}
    for e in busy:
        kind = "resize" if e["kind"].startswith("resize.") else e["kind"]
        acc = out.setdefault(kind, np.zeros(num_bins))
        a, b = e["t_start"], e["t_end"]
        lo, hi = np.searchsorted(edges, a, "right") - 1, np.searchsorted(edges, b, "left")
        idx = np.arange(max(lo, 0), min(hi, num_bins))
        overlap = np.minimum(edges[idx + 1], b) - np.maximum(edges[idx], a)
        acc[idx] += np.clip(overlap, 0, None) / width
    return edges, {k: np.minimum(v, num_devices) for k, v in out.items()}


def plot_utilisation(events: list[dict], num_devices: int, out: Path) -> float:
    """utilisation.png; returns the mean busy fraction over the plotted span."""
    import matplotlib.pyplot as plt

    edges, per_kind = utilisation(events, num_devices)
    fig, ax = plt.subplots(figsize=(10, 4))
    mids = (edges[:-1] + edges[1:]) / 2
    kinds = sorted(per_kind)
    if kinds:
        ax.stackplot(mids, [per_kind[k] / num_devices for k in kinds], labels=kinds,
                     colors=[COLOURS.get(k, "#C44E52") for k in kinds])
        ax.legend(loc="upper right", fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("busy fraction of devices")
    ax.set_title("utilisation over time")
    fig.tight_layout()
    fig.savefig(out / "utilisation.png", dpi=110)
    plt.close(fig)
    total = sum(per_kind.values()) if per_kind else np.zeros(1)
    return float(np.mean(np.minimum(total, num_devices)) / num_devices)


def plot_stages(metrics: list[dict], out: Path) -> None:
    """stages.png (seconds per step and the allocation) and reward.png (if rewards vary)."""
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(figsize=(10, 4))
    for key in ("rollout_s", "train_s", "step_s"):
        ax.plot(steps, [m[key] for m in metrics], marker=".", label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    twin = ax.twinx()
    twin.step(steps, [m["num_rollout_devices"] for m in metrics], where="mid", color="gray",
              linestyle=":", label="rollout devices")
    twin.set_ylabel("rollout devices")
    ax.legend(loc="upper left", fontsize=7)
    ax.set_title("stage times per step")
    fig.tight_layout()
    fig.savefig(out / "stages.png", dpi=110)
    plt.close(fig)
    rewards = [m["reward_mean"] for m in metrics]
    if len(set(rewards)) > 1:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.plot(steps, rewards, marker=".")
        ax.set_xlabel("step")
        ax.set_ylabel("mean reward")
        ax.set_title("reward")
        fig.tight_layout()
        fig.savefig(out / "reward.png", dpi=110)
        plt.close(fig)


def summary_text(path: Path, metrics: list[dict], events: list[dict],
                 summary: dict[str, Any], busy_fraction: float) -> str:
    """The text summary: totals, per-stage means, resizes and their critical paths."""
    def mean(key: str) -> float:
        return float(np.mean([m[key] for m in metrics])) if metrics else 0.0

    last_reward = metrics[-1]["reward_mean"] if metrics else 0.0
    idle_per_step_s = idle_device_s_per_step(summary, events, len(metrics))
    resizes = [e for e in events if e["kind"] == "resize"]
    by_index = {e.get("resize"): e for e in resizes}
    crit = [e.get("critical_path_s", 0.0) for e in by_index.values() if e.get("ok", True)]
    lines = [f"run directory: {path}",
             f"steps: {len(metrics)}   wall: {summary.get('wall_s', 0.0):.2f} s   "
             f"samples/s: {summary.get('samples_per_s', 0.0):.2f}   "
             f"tokens/s: {summary.get('tokens_per_s', 0.0):.1f}",
             f"mean step {mean('step_s'):.3f} s (rollout {mean('rollout_s'):.3f} s, "
             f"train after the rollout {mean('train_s'):.3f} s"
             + (f", training {mean('train_device_s'):.3f} device-s"
                if metrics and "train_device_s" in metrics[0] else "")
             + "); p99 step "
             f"{np.percentile([m['step_s'] for m in metrics], 99) if metrics else 0.0:.3f} s",
             f"bubble fraction: {summary.get('bubble_fraction', 0.0):.1%}   "
             f"mean busy devices (utilisation plot): {busy_fraction:.1%}",
             f"idle device-seconds per step (could be handed back to the cluster): "
             f"{idle_per_step_s:.1f}",
             f"resizes: {summary.get('num_resizes', len(crit))} ok, "
             f"{sum(not e.get('ok', True) for e in by_index.values())} failed; "
             f"mean critical path {np.mean(crit) if crit else 0.0:.3f} s",
             f"final reward: {summary.get('final_reward', last_reward)}"]
    if eval_summary(metrics):
        lines.append(str(eval_summary(metrics)))
    lines.extend(tail_lines(metrics, summary))
    if metrics:
        allocs = sorted({(m["num_rollout_devices"], m["num_train_devices"]) for m in metrics})
        lines.append("allocations seen (rollout/train): "
                     + ", ".join(f"{r}/{t}" for r, t in allocs[:12]))
    return "\n".join(lines) + "\n"


def tail_lines(metrics: list[dict], summary: dict[str, Any]) -> list[str]:
    """The rollout's tail (metrics.jsonl `tail_tokens_per_s`) and speculation's acceptance
    (summary.json `speculation`), each where the run has it."""
    lines = []
    tails = [m["tail_tokens_per_s"] for m in metrics if "tail_tokens_per_s" in m]
    if tails:
        lines.append(f"tail requests (each step's longest quarter, submission to completion): "
                     f"{np.mean(tails):.2f} tokens/s on average over {len(tails)} steps "
                     f"(slowest step {min(tails):.2f})")
    acceptance = acceptance_line(summary.get("speculation"))
    if acceptance is not None:
        lines.append(acceptance)
    return lines


def report(path: str | Path) -> str:
    """Write the plots and summary.txt into `path`; return the summary text."""
    import matplotlib

    matplotlib.use("Agg")
    path = Path(path)
    metrics, events, summary = load_run(path)
    for name in OPTIONAL_PLOTS:  # written below only when the run has them: none stale
        (path / name).unlink(missing_ok=True)
    num_devices = 1 + max((e["device"] for e in events), default=0)
    plot_timeline(events, path)
    busy = plot_utilisation(events, num_devices, path)
    plot_stages(metrics, path)
    plot_eval(metrics, path)
    text = summary_text(path, metrics, events, summary, busy)
    (path / "summary.txt").write_text(text)
    return text


def cmd_report(args: argparse.Namespace) -> int:
    print(report(args.run_dir), end="")
    written = [n for n in (*PLOTS, *OPTIONAL_PLOTS) if (Path(args.run_dir) / n).is_file()]
    print(f"plots: {args.run_dir}/{', '.join(written)}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `report` to the `dynaresize` command."""
    rep = subparsers.add_parser("report", help="plots and a text summary of a run directory")
    rep.add_argument("run_dir", metavar="DIR", help="a live or simulated run directory")
    rep.set_defaults(func=cmd_report)
