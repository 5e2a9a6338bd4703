"""`dynaresize calibrate RUN_DIR`: fit the twin's cost model to a live run.

Consumes a live run directory (config.toml, events.jsonl, samples.jsonl); produces a
`CostModel` whose simulated times match the run's, written as calibration.json. Fitted (least
squares, non-negative), each from the records that measure it:

- rollout: each (step, device) `rollout` span D as `a * I + c * T + p * P`, with T the
  response tokens the device generated in that step, P their prompt tokens, and I the decode
  iterations its engine ran (list scheduling of its requests over `max_running_requests`
  slots). Mapped to `iteration_overhead_s = a`, the compute term `2 * params * b / (FLOPs *
  decode_mfu) = c * b` (per request per iteration), prefill `p` per prompt token; memory
  bandwidth and KV capacity are set so large that they never bind (a tiny CPU model).
- training: each step's `train` span as `o + beta * tokens / num_train_devices` →
  `train_step_overhead_s = o`, `train_token_s() = beta`, data-parallel overhead 0.
- weight sync: the mean `weight_sync` (publish) span → `weight_sync_latency_s`; the mean
  `load_weights` span minus it → the transfer term.

`trace_from_run(DIR)` turns a run's samples.jsonl into a replayable workload; prompt lengths
are rebuilt from config.toml's task (seeded, torch-free), so `dynaresize simulate
--calibration FILE --from-run DIR` predicts a live run of that config.
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path
from typing import Any

import numpy as np

from dynaresize.config import Config, ConfigError, load_config
from dynaresize.core.rundir import read_jsonl
from dynaresize.sim.costs import CostModel, GpuSpec, ModelSpec
from dynaresize.sim.resize_costs import ResizeCosts
from dynaresize.sim.traces import TraceWorkload
from dynaresize.sim.workloads import StepRequests

NOMINAL_PARAMS = 1e6
"""Parameter count the calibrated model is expressed in (only ratios matter)."""


def _read(run_dir: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir / name
    if not path.is_file():
        raise ValueError(f"{path}: missing (is {run_dir} a `dynaresize train --out` directory?)")
    return read_jsonl(path)


def load_run_config(run_dir: str | Path) -> Config:
    """The run's config.toml (validated without checking this machine's devices)."""
    path = Path(run_dir) / "config.toml"
    try:
        return load_config(path, check_machine=False)
    except ConfigError as exc:
        raise ValueError(str(exc) if exc.source else f"{path}: {exc}") from None


def prompt_batches(cfg: Config, steps: int) -> list[dict[int, tuple[int, int]]]:
    """Per step: prompt id → (position in the batch, prompt tokens), rebuilt from the task
    (seeded, torch-free)."""
    from dynaresize.tasks import make_task

    task = make_task(cfg)
    return [{p.id: (i, len(p.tokens)) for i, p in
             enumerate(task.batch(k, cfg.task.prompts_per_step, cfg.run.seed))}
            for k in range(steps)]


def trace_from_run(run_dir: str | Path) -> TraceWorkload:
    """The run's requests as a workload: response lengths from samples.jsonl, prompt
    lengths from the task. Errors name the file and the missing (step, prompt, sample)."""
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    samples = _read(run_dir, "samples.jsonl")
    num_steps = 1 + max((int(s["step"]) for s in samples), default=-1)
    if num_steps == 0:
        raise ValueError(f"{run_dir / 'samples.jsonl'}: no samples")
    num_p, num_s = cfg.task.prompts_per_step, cfg.task.samples_per_prompt
    batches = prompt_batches(cfg, num_steps)
    lengths = np.zeros((num_steps, num_p, num_s), dtype=np.int64)
    prompts = np.zeros((num_steps, num_p), dtype=np.int64)
    seen = np.zeros_like(lengths, dtype=bool)
    for line_no, s in enumerate(samples, 1):
        try:
            k, p, j, n = int(s["step"]), int(s["prompt"]), int(s["sample"]), \
                int(s["response_tokens"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{run_dir / 'samples.jsonl'}: record {line_no}: {exc!r}") from None
        if p not in batches[k] or not 0 <= j < num_s:
            raise ValueError(f"{run_dir / 'samples.jsonl'}: record {line_no}: prompt {p} "
                             f"sample {j} is not in step {k}'s batch of the config's task")
        i, prompts[k, batches[k][p][0]] = batches[k][p][0], batches[k][p][1]
        lengths[k, i, j], seen[k, i, j] = max(1, n), True
    if not seen.all():
        k, p, j = (int(x) for x in np.argwhere(~seen)[0])
        raise ValueError(f"{run_dir / 'samples.jsonl'}: step {k} lacks prompt {p} sample {j}")
    steps = [StepRequests(k, lengths[k], prompts[k]) for k in range(num_steps)]
    return TraceWorkload(str(run_dir), steps)


def list_schedule_iters(lengths: list[int], slots: int) -> int:
    """Iterations an engine with `slots` slots needs for `lengths`, admitted in order."""
    free = [0] * min(slots, max(1, len(lengths)))
    end = 0
    for n in lengths:
        start = heapq.heappop(free)
        heapq.heappush(free, start + n)
        end = max(end, start + n)
    return end


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (drop negative columns, refit)."""
    keep = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        neg = [i for i in keep if coef[i] < 0]
        if not neg:
            return coef
        keep.remove(min(neg, key=lambda i: coef[i]))


def calibrate(run_dir: str | Path) -> dict[str, Any]:
    """Fit the cost model to a live run (module docstring); returns calibration.json's
    content: `fitted` parameters, `quality` of the fit, and the `cost_model` fields."""
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    events = _read(run_dir, "events.jsonl")
    trace = trace_from_run(run_dir)
    batches = prompt_batches(cfg, trace.num_steps)
    per_dev: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s in _read(run_dir, "samples.jsonl"):
        k, p = int(s["step"]), int(s["prompt"])
        per_dev.setdefault((k, int(s["device"])), []).append(
            (int(s["response_tokens"]), batches[k][p][1]))
    rows, spans = [], []
    for e in events:
        key = (int(e.get("step", -1)), int(e["device"]))
        if e["kind"] == "rollout" and key in per_dev:
            reqs = per_dev[key]
            rows.append([list_schedule_iters([n for n, _ in reqs],
                                             cfg.rollout.max_running_requests),
                         sum(n for n, _ in reqs), sum(p for _, p in reqs)])
            spans.append(e["t_end"] - e["t_start"])
    if not rows:
        raise ValueError(f"{run_dir / 'events.jsonl'}: no rollout events matching samples")
    x, y = np.array(rows, dtype=float), np.array(spans)
    a, c, p = _nnls(x, y)
    rel_rmse = float(np.sqrt(np.mean((x @ np.array([a, c, p]) - y) ** 2)) / y.mean())
    # Training device-seconds per step: one span per device (plain steps) or one per
    # micro-batch plus the optimizer step (streaming); either way the sum over the step's
    # spans is `o * devices + beta * tokens` (the twin charges the same).
    train: dict[int, float] = {}
    train_devices: dict[int, set[int]] = {}
    for e in events:
        if e["kind"] == "train":
            k = int(e["step"])
            train[k] = train.get(k, 0.0) + e["t_end"] - e["t_start"]
            train_devices.setdefault(k, set()).add(int(e["device"]))
    tx = np.array([[float(len(train_devices[k])), _trained_tokens(trace.step_requests(k))]
                   for k in sorted(train)])
    o, beta = _nnls(tx, np.array([train[k] for k in sorted(train)]))
    sync = [e["t_end"] - e["t_start"] for e in events if e["kind"] == "weight_sync"]
    load = [e["t_end"] - e["t_start"] for e in events if e["kind"] == "load_weights"]
    latency_s = float(np.mean(sync)) if sync else 0.0
    transfer_s = max(1e-6, (float(np.mean(load)) if load else 0.0) - latency_s)
    fitted = {"iteration_overhead_s": float(a), "decode_s_per_request_iter": float(c),
              "prefill_s_per_token": float(p), "train_step_overhead_s": float(o),
              "train_s_per_token": float(beta), "weight_sync_latency_s": latency_s,
              "weight_transfer_s": transfer_s,
              "max_running_requests": float(cfg.rollout.max_running_requests)}
    return {"run_dir": str(run_dir), "fitted": fitted,
            "quality": {"rollout_rel_rmse": rel_rmse, "num_rollout_spans": len(spans),
                        "num_train_steps": len(train)}}


def _trained_tokens(req: StepRequests) -> int:
    return int(req.response_tokens.sum() + req.response_tokens.shape[1] * req.prompt_tokens.sum())


def cost_model_from_fit(fitted: dict[str, float]) -> CostModel:
    """The `CostModel` whose simulated times are the fitted ones (module docstring)."""
    flops = 1e15
    c = max(fitted["decode_s_per_request_iter"], 1e-12)
    decode_mfu = 2 * NOMINAL_PARAMS / (flops * c)
    prefill = fitted["prefill_s_per_token"]
    prefill_mfu = 2 * NOMINAL_PARAMS / (flops * prefill) if prefill > 0 else 1e12
    beta = max(fitted["train_s_per_token"], 1e-12)
    gpu = GpuSpec("calibrated", hbm_bytes_per_s=1e21, bf16_flops_per_s=flops,
                  memory_bytes=1e15)
    model = ModelSpec("calibrated", num_params=NOMINAL_PARAMS, num_layers=1, num_kv_heads=1,
                      head_dim=1)
    return CostModel(gpu, model, decode_bw_efficiency=1.0, decode_mfu=decode_mfu,
                     prefill_mfu=prefill_mfu,
                     iteration_overhead_s=fitted["iteration_overhead_s"],
                     max_running_requests=int(fitted["max_running_requests"]),
                     train_mfu=8.0 * NOMINAL_PARAMS / (flops * beta),
                     train_flops_per_token_factor=8.0, dp_overhead_per_doubling=0.0,
                     train_step_overhead_s=fitted["train_step_overhead_s"],
                     weight_sync_bytes_per_s=model.weight_bytes / fitted["weight_transfer_s"],
                     weight_sync_latency_s=fitted["weight_sync_latency_s"],
                     resize=ResizeCosts())


def write_calibration(fit: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(fit, indent=2) + "\n")


def load_calibration(path: str | Path) -> CostModel:
    """calibration.json → CostModel; ValueError naming the file and the bad field."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read calibration ({exc})") from None
    fitted = data.get("fitted") if isinstance(data, dict) else None
    keys = ("iteration_overhead_s", "decode_s_per_request_iter", "prefill_s_per_token",
            "train_step_overhead_s", "train_s_per_token", "weight_sync_latency_s",
            "weight_transfer_s", "max_running_requests")
    for key in keys:
        value = fitted.get(key) if isinstance(fitted, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{path}: field 'fitted.{key}' = {value!r}: must be a number >= 0")
    return cost_model_from_fit(fitted)
