"""Validation of what the machine and the cluster offer (pure, no torch): enough devices for a
local cluster, vLLM and a model it can serve, a well-formed `[ray]` table. Each bad value
raises `ConfigError` naming the field, the value and what is allowed."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from dynaresize.config.checks import one_of, positive
from dynaresize.config.schema import (
    CPU_DEVICE_BYTES,
    PLACEMENTS,
    VLLM_CPU_HEAD_DIMS,
    VLLM_INSTALL,
    Config,
    ConfigError,
)


def machine_device_limit(device_type: str) -> int:
    """How many devices of this type the machine offers (without importing torch)."""
    if device_type == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return len([d for d in visible.split(",") if d.strip()])
        return len([d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()])
    # Total memory, not free memory: free pages shrink with the page cache and with whatever
    # else runs, which would make validation depend on the moment.
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 * 2**30
    return max(1, min(64, total // CPU_DEVICE_BYTES))


def validate_machine(cfg: Config) -> None:
    """What this machine offers: vLLM for `rollout.engine = "vllm"`, enough devices for a
    local cluster."""
    a = cfg.allocation
    if cfg.rollout.engine == "vllm":
        _validate_vllm(cfg)
    if not cfg.ray.address:
        limit = machine_device_limit(cfg.devices.type)
        if cfg.devices.type == "cuda":  # devices sharing a GPU
            limit = int(limit / cfg.devices.gpus_per_device + 1e-9)
        if cfg.num_devices > limit:
            raise ConfigError(
                "allocation", f"{a.num_rollout_devices} rollout + {a.num_train_devices} train",
                f"this machine offers at most {limit} {cfg.devices.type} devices")


def validate_ray(cfg: Config) -> None:
    address = cfg.ray.address
    if address and address != "auto":
        host, _, port = address.rpartition(":")
        if "://" in address or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("ray.address", address,
                              "allowed: '' (start a local cluster on loopback), 'auto', or "
                              "'HOST:PORT' of a running cluster's GCS (e.g. 10.0.0.1:6379)")
    one_of("ray.placement", cfg.ray.placement, PLACEMENTS)
    positive("ray.placement_timeout_s", cfg.ray.placement_timeout_s)


def model_head_dim(cfg: Config) -> int | None:
    """Attention head size of the configured model (None: not known without loading it)."""
    if not cfg.model.path:
        return cfg.model.hidden_size // cfg.model.num_heads
    try:
        with open(Path(cfg.model.path) / "config.json") as f:
            hf = json.load(f)
        return int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def _validate_vllm(cfg: Config) -> None:
    """rollout.engine = 'vllm' on real devices: vLLM installed, a model it can serve."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("rollout.engine", "vllm", f"vLLM is not installed: run `{VLLM_INSTALL}`")
    head_dim = model_head_dim(cfg)
    if cfg.devices.type == "cpu" and head_dim is not None and head_dim not in VLLM_CPU_HEAD_DIMS:
        how = ("" if cfg.model.path else f" = model.hidden_size {cfg.model.hidden_size} / "
               f"model.num_heads {cfg.model.num_heads}; e.g. --set model.num_heads="
               f"{max(1, cfg.model.hidden_size // 32)}")
        raise ConfigError("rollout.engine", "vllm",
                          f"vLLM's CPU attention supports head_dim "
                          f"{', '.join(map(str, VLLM_CPU_HEAD_DIMS))}; this model has head_dim "
                          f"{head_dim}{how} (or use rollout.engine = 'builtin')")
