"""`report`'s evaluation part: eval.png (held-out accuracy and reward against the policy
version, beside the training reward) and its summary line. Used by `dynaresize.app.report`."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def eval_points(metrics: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """(policy version, held-out accuracy, held-out reward) of every evaluated version."""
    return [(int(m["eval_version"]), float(m["eval_accuracy"]), float(m["eval_reward"]))
            for m in metrics if "eval_accuracy" in m and "eval_version" in m]


def eval_summary(metrics: list[dict[str, Any]]) -> str | None:
    """One summary line (first -> last held-out accuracy), or None without evaluations."""
    points = eval_points(metrics)
    if not points:
        return None
    (v0, a0, _), (v1, a1, r1) = points[0], points[-1]
    return (f"held-out accuracy: {a0:.3f} (version {v0}) -> {a1:.3f} (version {v1}), "
            f"change {a1 - a0:+.3f}; held-out reward {r1:.3f}")


def plot_eval(metrics: list[dict[str, Any]], out: Path) -> bool:
    """eval.png; False (nothing written) when the run has no evaluations."""
    import matplotlib.pyplot as plt

    points = eval_points(metrics)
    if not points:
        return False
    fig, ax = plt.subplots(figsize=(8, 4))
    versions = [v for v, _, _ in points]
    ax.plot(versions, [a for _, a, _ in points], marker="o", color="#C44E52",
            label="held-out accuracy (greedy)")
    ax.plot(versions, [r for _, _, r in points], marker=".", linestyle="--", color="#8172B3",
            label="held-out reward (greedy)")
    # a training step k samples with version policy_version: plot its reward there
    ax.plot([m["policy_version"] for m in metrics], [m["reward_mean"] for m in metrics],
            marker=".", linewidth=0.8, alpha=0.7, color="#4C72B0",
            label="training reward (sampled, by generating version)")
    ax.set_xlabel("policy version (optimizer steps)")
    ax.set_ylabel("accuracy / reward")
    ax.set_ylim(0, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("held-out evaluation")
    fig.tight_layout()
    fig.savefig(out / "eval.png", dpi=110)
    plt.close(fig)
    return True
