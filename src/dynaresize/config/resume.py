"""What `dynaresize train --resume DIR` may change in the run's config (docs/faults.md). No
torch/Ray.

A resume continues the same run: the samples and the update of every step are a function of
the config and the seed (design §2), so every key that changes a token or the update is
frozen. Keys that change only speed, placement or what is written stay changeable: the
allocation and devices, the controller, `[resize]`, `[faults]`, `[ray]`, `[eval]`, `[output]`,
`run.steps`/`checkpoint_every`/`export_every`, the engine's slots and slices, the tail
policy, and speculation on or off with its drafting (exact: the same tokens).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from dynaresize.config.literal import toml_repr
from dynaresize.config.schema import Config, ConfigError

__all__ = ["FROZEN_ON_RESUME", "CHANGEABLE_IN_FROZEN", "check_more_steps",
           "check_resume_config", "frozen_keys"]

FROZEN_ON_RESUME = (
    "run.seed", "run.staleness",
    "model", "task", "train", "env",
    "rollout.engine", "rollout.temperature", "rollout.batch_invariant",
    "rollout.whole_prompt_prefill", "rollout.speculative.forward_rows",
)
"""Sections and keys a resume may not change: each changes the samples or the update
(`train` holds `[train.loss]` and `[train.dynamic_sampling]`, the recipe)."""

CHANGEABLE_IN_FROZEN = ("env.latency_s",)
"""Keys inside a frozen section that change only timing (a tool's sleep)."""


def _leaves(value: Any, key: str) -> dict[str, Any]:
    """Every leaf of a (nested) config dataclass, by dotted key."""
    if not is_dataclass(value):
        return {key: value}
    out: dict[str, Any] = {}
    for f in fields(value):
        out.update(_leaves(getattr(value, f.name), f"{key}.{f.name}"))
    return out


def frozen_keys(cfg: Config) -> dict[str, Any]:
    """Dotted key -> value of every key of `cfg` a resume may not change."""
    out: dict[str, Any] = {}
    for key in FROZEN_ON_RESUME:
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        out.update(_leaves(value, key))
    return {k: v for k, v in out.items() if k not in CHANGEABLE_IN_FROZEN}


def check_resume_config(base: Config, resumed: Config) -> None:
    """`resumed` (the run's config.toml plus `--set`) against `base` (the file alone):
    ConfigError naming the first frozen key that differs, its new and its checkpoint's value."""
    old = frozen_keys(base)
    for key, value in frozen_keys(resumed).items():
        if value != old[key]:
            raise ConfigError(key, value, f"must stay {toml_repr(old[key])} (the checkpoint's "
                              "run) on --resume: it changes the samples or the update")


def check_more_steps(steps: int, num_done: int, run_dir: object) -> None:
    """ConfigError unless `run.steps` goes past the `num_done` steps the checkpoint of
    `run_dir` holds (a resume that trains nothing would only rewrite the run's summary)."""
    if steps <= num_done:
        raise ConfigError("run.steps", steps, f"the checkpoint of {run_dir} already holds "
                          f"{num_done} steps: to train more, --set run.steps=N with "
                          f"N > {num_done}")
