"""Resize latency benchmark: our executor's critical path against a naive resize, per model.

For each model: a fresh pool of 4 device actors (so the first resize into a membership
creates its group) → our resize sequence (`resize_ours`) → a DCP checkpoint of the training
state at 2 rollout / 2 train → the naive resize of the same two moves (`resize_naive`, which
kills pool actors) → the pool is shut down. One Ray session (loopback) for all models.

`summarize` reduces the measurements to one row per model and direction: our critical path on
a first-time membership and on a repeated one (the median over repeats), the naive critical
path, the ratio naive / ours (repeat), group creations, each op's share of our critical path,
bytes moved and peak staging.
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from dynaresize.config import Config, load_config

MODELS: dict[str, tuple[str, ...]] = {
    "tiny": (),
    "100m": ("model.hidden_size=768", "model.num_layers=12", "model.num_heads=12",
             "model.intermediate_size=3072"),
}
"""Model presets: config overrides (`--set` syntax) on the embedded default (random init)."""

BASE = ("allocation.num_rollout_devices=2", "allocation.num_train_devices=2",
        "devices.type='cpu'", "train.micro_batch_size=2")
MOVES = (("rollout->train", 1, (1, 2, 3)), ("train->rollout", 2, (3,)))
"""(move, device d, new training group G') from 2 rollout / 2 train devices {0,1} / {2,3}."""
NAIVE_MOVES = tuple(move for move, _, _ in MOVES)


def model_config(name: str, extra: tuple[str, ...] = ()) -> Config:
    if name not in MODELS:
        raise ValueError(f"model {name!r}: allowed {', '.join(MODELS)}")
    return load_config(None, [*BASE, *MODELS[name], *extra])


def num_params(cfg: Config) -> int:
    """Parameters of the model `cfg` describes (built on the meta device: no memory)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from dynaresize.models import tiny_qwen2_config
    from dynaresize.tasks import make_task

    tok = make_task(cfg).tokenizer
    qcfg = tiny_qwen2_config(cfg.model, tok.vocab_size, eos_token_id=tok.eos_id,
                             bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)
    with torch.device("meta"):
        return sum(p.numel() for p in Qwen2ForCausalLM(qcfg).parameters())


def bench_model(name: str, cfg: Config, repeats: int, tmp_dir: str,
                progress: Callable[[str], None],
                naive_moves: tuple[str, ...] = NAIVE_MOVES) -> dict[str, Any]:
    """Everything measured for one model (see module docstring); the naive resize only for
    `naive_moves` (each starts fresh processes: seconds on 2 cores)."""
    from dynaresize.app.benchmarks.resize_naive import measure_naive
    from dynaresize.app.benchmarks.resize_ours import run_sequence, save_checkpoint
    from dynaresize.devices.pool import DevicePool

    out: dict[str, Any] = {"name": name, "num_params": num_params(cfg),
                           "overrides": list(MODELS[name]),
                           "staging_bytes": cfg.resize.staging_bytes}
    progress(f"[{name}] {out['num_params'] / 1e6:.1f}M parameters: starting 4 device actors")
    t0 = time.perf_counter()
    pool = DevicePool(4, "cpu", cfg.devices.threads_per_device)
    try:
        out["pool_start_s"] = time.perf_counter() - t0
        progress(f"[{name}] pool up in {out['pool_start_s']:.1f}s; building models, one "
                 "optimizer step, our resizes")
        ours = asyncio.run(run_sequence(pool, cfg, repeats, progress))
        out["ours"] = [asdict(m) | {"path_shares": m.path_shares()} for m in ours]
        if naive_moves:
            path = f"{tmp_dir}/{name}-ckpt"
            out["checkpoint"] = asyncio.run(save_checkpoint(pool, (2, 3), path))
            progress(f"[{name}] DCP checkpoint written in {out['checkpoint']['save_s']:.2f}s "
                     f"({out['checkpoint']['checkpoint_bytes'] / 2**20:.0f} MiB); naive resizes")
            out["naive"] = {}
            for move, device, new_train in MOVES:
                if move not in naive_moves:
                    continue
                m = measure_naive(pool.actors[device], device, new_train, cfg.to_dict(), path,
                                  optimizer_step=1, threads=cfg.devices.threads_per_device)
                out["naive"][move] = asdict(m) | {
                    "loaded_state_matches": m.param_sum == out["checkpoint"]["param_sum"]}
                progress(f"  naive {move}: {m.critical_path_s:.2f}s " + ", ".join(
                    f"{k} {v:.2f}" for k, v in m.phases_s.items() if v))
    finally:
        pool.shutdown()
    out["summary"] = summarize(out)
    return out


def summarize(model: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per direction (module docstring)."""
    rows = []
    for move, _, _ in MOVES:
        first = [m for m in model["ours"] if m["move"] == move and m["label"] == "first"]
        repeat = [m for m in model["ours"] if m["move"] == move and m["label"] == "repeat"]
        if not first or not repeat:
            continue
        rep = sorted(repeat, key=lambda m: m["critical_path_s"])[(len(repeat) - 1) // 2]
        row: dict[str, Any] = {
            "model": model["name"], "move": move,
            "ours_first_s": first[0]["critical_path_s"],
            "ours_repeat_s": statistics.median(m["critical_path_s"] for m in repeat),
            "ours_group_ready_s": statistics.median(m["group_ready_s"] for m in repeat),
            "group_creations_first": first[0]["num_group_creations"],
            "group_creations_repeat": max(m["num_group_creations"] for m in repeat),
            "path_shares": rep["path_shares"],
            "reshard_transfer_share": rep["reshard_transfer_s"] / max(rep["critical_path_s"],
                                                                      1e-9),
            "bytes_moved": rep["bytes_moved"],
            "peak_staging_bytes": rep["peak_staging_bytes"],
            "staging_bytes": rep["staging_bytes"]}
        naive = model.get("naive", {}).get(move)
        if naive is not None:
            # design §4: the critical path is what delays the stage that waits for d
            row["naive_s"] = naive["device_ready_s"]
            row["ratio"] = naive["device_ready_s"] / max(row["ours_repeat_s"], 1e-9)
            row["ratio_first"] = naive["device_ready_s"] / max(row["ours_first_s"], 1e-9)
            row["naive_group_ready_s"] = naive["critical_path_s"]
            row["group_ratio"] = naive["critical_path_s"] / max(row["ours_group_ready_s"],
                                                                 1e-9)
        rows.append(row)
    return rows


def run_resize_bench(models: list[str], repeats: int = 1, staging_bytes: int | None = None,
                     naive_moves: tuple[str, ...] = NAIVE_MOVES,
                     progress: Callable[[str], None] = print,
                     extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The whole benchmark in one Ray session (started on loopback unless one is running)."""
    import tempfile

    from dynaresize.devices.ray_device import ray_session

    if repeats < 1:
        raise ValueError(f"repeats = {repeats}: must be >= 1")
    cfgs = {}
    for name in models:
        sets = extra + ((f"resize.staging_bytes={staging_bytes}",) if staging_bytes else ())
        cfgs[name] = model_config(name, sets)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "repeats": repeats,
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform(),
                    "backend": "gloo", "devices": 4, "threads_per_device":
                    next(iter(cfgs.values())).devices.threads_per_device},
        "models": []}
    progress(f"resize benchmark: models {', '.join(models)}, {repeats} repetition(s), "
             f"4 CPU devices (gloo), Ray on loopback")
    with ray_session(num_cpus=8), \
            tempfile.TemporaryDirectory(prefix="dynaresize-bench-") as tmp:
        for name in models:
            result["models"].append(bench_model(name, cfgs[name], repeats, tmp, progress,
                                                naive_moves))
    return result
