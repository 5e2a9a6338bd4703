"""Training state on disk with `torch.distributed.checkpoint` (DCP, design §3).

A checkpoint holds the FSDP2 trainer's model and AdamW state under two top-level keys,
`model` and `optim` (DCP flattens them to `model.<fqn>` / `optim.state.<fqn>.exp_avg` …). DCP
stores each rank's dim-0 shards with their global offsets, so a checkpoint written by a group of
R ranks loads into a group of any size R' (it reshards on load), and its model part loads into a
plain, unsharded model without any process group (`load_model_weights`), e.g. for a rollout
engine.

`save_train_state` and `load_train_state` are COLLECTIVE over the trainer's group.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

if TYPE_CHECKING:
    from dynaresize.train.trainer import FSDPTrainer


def _dir_bytes(path: str | os.PathLike[str]) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())


def save_train_state(trainer: FSDPTrainer, path: str | os.PathLike[str]) -> dict[str, float]:
    """Collective: write the trainer's model + optimizer state to the directory `path`.
    Returns {"save_s", "checkpoint_bytes"} (bytes of every file in `path`, as seen here)."""
    t0 = time.perf_counter()
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path),
             process_group=trainer.group)
    save_s = time.perf_counter() - t0
    return {"save_s": save_s, "checkpoint_bytes": float(_dir_bytes(path))}


def load_train_state(trainer: FSDPTrainer, path: str | os.PathLike[str],
                     optimizer_step: int) -> dict[str, float]:
    """Collective: load model + optimizer state (written by a group of any size) into the
    trainer's shards. `optimizer_step` creates the AdamW state the checkpoint fills in.
    Returns {"load_s"}."""
    t0 = time.perf_counter()
    trainer.init_optimizer_state(optimizer_step)
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path), process_group=trainer.group)
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    trainer.sync_replica()
    return {"load_s": time.perf_counter() - t0}


def load_model_weights(model: torch.nn.Module, path: str | os.PathLike[str]) -> dict[str, float]:
    """Local (no process group): load the checkpoint's model part into a plain model in place.
    Returns {"load_s"}."""
    t0 = time.perf_counter()
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    model.load_state_dict(state["model"], strict=True)
    return {"load_s": time.perf_counter() - t0}
