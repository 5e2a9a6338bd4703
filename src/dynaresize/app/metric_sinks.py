"""Metric sinks users expect beside metrics.jsonl (which stays the source of truth).

* TensorBoard: event files in the run directory (`tensorboard --logdir RUN_DIR`), on by
  default (`output.tensorboard`) when the `tensorboard` package is installed.
* Weights & Biases: offline mode (`output.wandb = true`; `wandb sync RUN_DIR/wandb/...` to
  upload), when the `wandb` package is installed (else ConfigError-free: a notice).

Each sink receives every metrics record (numbers only; the step is `record["step"]`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Protocol


class MetricSink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a record except `step` (bools excluded)."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardSink:
    """Scalars under `<run dir>/` as TensorBoard event files (group/name tags)."""

    def __init__(self, path: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(path))

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for key, value in scalars(record).items():
            group = "eval" if key.startswith("eval_") else "train"
            self.writer.add_scalar(f"{group}/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """An offline Weights & Biases run in `<run dir>/wandb`."""

    def __init__(self, path: Path, project: str, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project=project, dir=str(path), mode="offline", config=config,
                              name=path.name)

    def write(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=int(record.get("step", 0)))

    def close(self) -> None:
        self.run.finish()


def make_sinks(cfg: Any, path: Path | None, notice: Any = print) -> list[MetricSink]:
    """The sinks `cfg.output` asks for (none without a run directory)."""
    if path is None:
        return []
    sinks: list[MetricSink] = []
    if cfg.output.tensorboard and importlib.util.find_spec("tensorboard") is not None:
        sinks.append(TensorBoardSink(path))
    if cfg.output.wandb:
        if importlib.util.find_spec("wandb") is None:
            notice("output.wandb = true but the wandb package is missing: pip install wandb")
        else:
            sinks.append(WandbSink(path, cfg.output.wandb_project, cfg.to_dict()))
    return sinks
