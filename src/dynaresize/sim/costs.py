"""Cost models of the digital twin: documented parameter sets, roofline-simple.

Every time the simulator charges comes from a `CostModel` = one GPU spec + one model spec +
efficiency factors. Sources of the public figures (also listed in docs/simulator.md):

- NVIDIA H100 SXM datasheet: 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense BF16 (1979 with sparsity).
  https://www.nvidia.com/en-us/data-center/h100/
- NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, same compute as H100 (989 TFLOP/s dense).
  https://www.nvidia.com/en-us/data-center/h200/
- Qwen2.5-7B / Qwen2.5-32B `config.json` on Hugging Face (7.62B / 32.8B parameters; 28 / 64
  layers; 4 / 8 KV heads of dim 128, grouped-query attention).
- vLLM defaults: `gpu_memory_utilization = 0.9`, `max_num_seqs = 256`.
- Kaplan et al. 2020, "Scaling Laws for Neural Language Models": ~2N FLOPs per token forward,
  ~6N forward + backward.

Decode iteration (one token for each of `batch` running requests holding `ctx` KV tokens)::

    t = overhead + max((weight_bytes + ctx * kv_bytes_per_token) / (HBM_bw * bw_eff),   # memory
                       2 * params * batch / (FLOPs * decode_mfu))                        # compute

Memory-bound at small batch (weights are read once per iteration, plus every KV byte),
compute-bound at large batch. One simulated device is one GPU running one engine (TP = 1):
a 32B model on an 80 GB H100 leaves little KV cache, as it would for real.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dynaresize.sim.resize_costs import RecoveryCosts, ResizeCosts, reshard_bytes


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator, from its datasheet."""

    name: str
    hbm_bytes_per_s: float
    """Peak HBM bandwidth."""
    bf16_flops_per_s: float
    """Peak dense BF16 tensor-core throughput."""
    memory_bytes: float
    """HBM capacity."""


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder-only transformer, from its config."""

    name: str
    num_params: float
    num_layers: int
    num_kv_heads: int
    head_dim: int
    bytes_per_param: int = 2
    """bf16 weights for serving."""
    train_state_bytes_per_param: int = 16
    """bf16 param + grad, fp32 master + two AdamW moments: what a reshard moves per param."""

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V, every layer, bf16."""
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * 2


@dataclass(frozen=True)
class CostModel:
    """Everything the simulator charges time for. Immutable; `replace()` to vary a field."""

    gpu: GpuSpec
    model: ModelSpec
    decode_bw_efficiency: float = 0.8
    """Fraction of peak HBM bandwidth decode kernels reach."""
    decode_mfu: float = 0.5
    prefill_mfu: float = 0.5
    iteration_overhead_s: float = 1e-3
    """Per decode iteration: scheduling, sampling, launches (with CUDA graphs)."""
    max_running_requests: int = 256
    kv_memory_fraction: float = 0.9
    """Share of HBM the engine may use for weights + KV cache."""
    train_mfu: float = 0.4
    train_flops_per_token_factor: float = 8.0
    """x params FLOPs per trained token: 6 (forward + backward) + 2 (old-policy log-probs)."""
    dp_overhead_per_doubling: float = 0.02
    """Data-parallel efficiency = 1 / (1 + this * log2(num_devices))."""
    train_step_overhead_s: float = 0.5
    """Per optimizer step: optimizer update, gradient-norm all-reduce, barriers."""
    weight_sync_bytes_per_s: float = 50e9
    weight_sync_latency_s: float = 0.05
    resize: ResizeCosts = field(default_factory=ResizeCosts)
    recovery: RecoveryCosts = field(default_factory=RecoveryCosts)
    speculation: Any = None
    """Speculative decoding (`sim.speculation.Speculation`; None: off). Set by `simulate
    --speculation` for every policy of a run alike; verify iterations: `sim.speculation`."""

    # ------------------------------------------------------------------ rollout
    def kv_capacity_tokens(self) -> int:
        """KV-cache tokens one device can hold; raises ValueError if the weights do not fit."""
        free_bytes = self.gpu.memory_bytes * self.kv_memory_fraction - self.model.weight_bytes
        if free_bytes <= self.model.kv_bytes_per_token:
            raise ValueError(f"model {self.model.name} does not fit on {self.gpu.name} (TP = 1)")
        return int(free_bytes // self.model.kv_bytes_per_token)

    def _mem_bytes_per_s(self) -> float:
        return self.gpu.hbm_bytes_per_s * self.decode_bw_efficiency

    def _compute_s(self, batch: int) -> float:
        return 2.0 * self.model.num_params * batch / (self.gpu.bf16_flops_per_s * self.decode_mfu)

    def decode_iter_s(self, batch: int, ctx_tokens: float) -> float:
        """One decode iteration for `batch` requests holding `ctx_tokens` KV tokens in all."""
        mem_s = (self.model.weight_bytes + ctx_tokens * self.model.kv_bytes_per_token) \
            / self._mem_bytes_per_s()
        return self.iteration_overhead_s + max(mem_s, self._compute_s(batch))

    def decode_span_s(self, num_iters: Any, batch: Any, start_ctx_tokens: Any) -> Any:
        """Closed-form sum of `num_iters` iterations at fixed `batch`, the KV context growing
        by `batch` tokens per iteration from `start_ctx_tokens`. Scalars or numpy arrays
        (broadcast element-wise) in, the same out."""
        if isinstance(num_iters, int) and isinstance(batch, int):
            return self.span_scalar_s(num_iters, batch, float(start_ctx_tokens))
        n = np.asarray(num_iters, dtype=np.float64)
        b = np.asarray(batch, dtype=np.float64)
        c0 = np.asarray(start_ctx_tokens, dtype=np.float64)
        bw, kv = self._mem_bytes_per_s(), self.model.kv_bytes_per_token
        comp_s = 2.0 * self.model.num_params * b / (self.gpu.bf16_flops_per_s * self.decode_mfu)
        # first iteration j at which the memory term reaches the compute term
        ctx_cross = (comp_s * bw - self.model.weight_bytes) / kv
        first_mem = np.minimum(n, np.maximum(0.0, np.ceil((ctx_cross - c0) / np.maximum(b, 1))))
        m = n - first_mem
        mem_sum_s = (m * (self.model.weight_bytes + c0 * kv)
                     + b * kv * (first_mem + n - 1) * m / 2.0) / bw
        total = np.where(n > 0, n * self.iteration_overhead_s + first_mem * comp_s + mem_sum_s,
                         0.0)
        return float(total) if total.ndim == 0 else total

    def __post_init__(self) -> None:
        # constants of the hot path (`span_scalar_s`), computed once per (frozen) model
        object.__setattr__(self, "hot_terms", (
            self._mem_bytes_per_s(), self.model.kv_bytes_per_token, self.model.weight_bytes,
            2.0 * self.model.num_params / (self.gpu.bf16_flops_per_s * self.decode_mfu)))
        object.__setattr__(self, "_span_terms", {})

    def span_terms(self, b: int) -> tuple[float, float]:
        """(compute seconds of one iteration at batch `b`, the KV context from which the memory
        term binds): the batch-only parts of `span_scalar_s`, cached (`SimDevice` inlines the
        rest, with the same operations in the same order)."""
        cache: dict[int, tuple[float, float]] = self._span_terms  # type: ignore[attr-defined]
        got = cache.get(b)
        if got is None:
            bw, kv, w, comp_per_request_s = self.hot_terms  # type: ignore[attr-defined]
            comp_s = comp_per_request_s * b
            got = cache[b] = (comp_s, (comp_s * bw - w) / kv)
        return got

    def span_scalar_s(self, n: int, b: int, c0: float) -> float:
        """`decode_span_s` for plain ints: the simulator's hot path, without numpy."""
        if n <= 0:
            return 0.0
        bw, kv, w, comp_per_request_s = self.hot_terms  # type: ignore[attr-defined]
        comp_s = comp_per_request_s * b
        first_mem = min(n, max(0, math.ceil(((comp_s * bw - w) / kv - c0) / max(b, 1))))
        m = n - first_mem
        mem_sum_s = (m * (w + c0 * kv) + b * kv * (first_mem + n - 1) * m / 2.0) / bw
        return n * self.iteration_overhead_s + first_mem * comp_s + mem_sum_s

    def decode_iters_within(self, budget_s: float, batch: int, start_ctx_tokens: float) -> int:
        """Largest number of iterations whose `decode_span_s` fits in `budget_s`.

        Iterations only get slower as the context grows, so `budget / first iteration` bounds
        the answer from above and `budget / iteration at that bound` from below; a binary
        search between the two needs a few span evaluations, not ~log2(budget / iteration)."""
        hi = int(budget_s / self.decode_iter_s(batch, start_ctx_tokens))
        lo = min(hi, int(budget_s / self.decode_iter_s(batch, start_ctx_tokens + batch * hi)))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.span_scalar_s(mid, batch, float(start_ctx_tokens)) <= budget_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def prefill_s(self, num_tokens: int) -> float:
        """Compute-bound prefill of `num_tokens` prompt (or recomputed) tokens."""
        return 2.0 * self.model.num_params * num_tokens \
            / (self.gpu.bf16_flops_per_s * self.prefill_mfu)

    # ------------------------------------------------------------------ training
    def dp_efficiency(self, num_devices: int) -> float:
        return 1.0 / (1.0 + self.dp_overhead_per_doubling * math.log2(max(1, num_devices)))

    def train_token_s(self) -> float:
        """Device-seconds per trained token at full efficiency (one device)."""
        return self.train_flops_per_token_factor * self.model.num_params \
            / (self.gpu.bf16_flops_per_s * self.train_mfu)

    def train_step_s(self, num_tokens: int, num_devices: int) -> float:
        """Wall seconds of one optimizer step over `num_tokens` on `num_devices` ranks."""
        return self.train_step_overhead_s + num_tokens * self.train_token_s() \
            / (num_devices * self.dp_efficiency(num_devices))

    # ------------------------------------------------------------------ sync and resizes
    def weight_sync_s(self) -> float:
        """Pushing one version of the serving weights to a rollout device."""
        return self.weight_sync_latency_s + self.model.weight_bytes / self.weight_sync_bytes_per_s

    def reshard_s(self, num_bytes: float) -> float:
        return num_bytes / self.resize.reshard_bytes_per_s

    def reshard_plan_s(self, old_members: tuple[int, ...], new_members: tuple[int, ...],
                       staging_bytes: int) -> tuple[float, dict[int, float]]:
        """The bounded-staging reshard from `old_members` to `new_members`: (wall seconds of
        the whole collective, bytes each device sends). See `reshard_bytes`."""
        state_bytes = self.model.num_params * self.model.train_state_bytes_per_param
        sent, busiest = reshard_bytes(old_members, new_members, state_bytes)
        chunks = math.ceil(busiest / max(1, staging_bytes))
        return self.reshard_s(busiest) + chunks * self.resize.staging_chunk_s, sent

    def train_state_bytes(self, num_devices: int) -> float:
        """One rank's share of the sharded training state (what leaves with it)."""
        return self.model.num_params * self.model.train_state_bytes_per_param / num_devices


H100 = GpuSpec("H100-SXM", hbm_bytes_per_s=3.35e12, bf16_flops_per_s=989e12, memory_bytes=80e9)
H200 = GpuSpec("H200-SXM", hbm_bytes_per_s=4.8e12, bf16_flops_per_s=989e12, memory_bytes=141e9)
QWEN_7B = ModelSpec("qwen2.5-7b", num_params=7.62e9, num_layers=28, num_kv_heads=4, head_dim=128)
QWEN_32B = ModelSpec("qwen2.5-32b", num_params=32.8e9, num_layers=64, num_kv_heads=8,
                     head_dim=128)

PRESETS: dict[str, CostModel] = {
    "h100-7b": CostModel(H100, QWEN_7B),
    "h200-7b": CostModel(H200, QWEN_7B),
    "h100-32b": CostModel(H100, QWEN_32B),
    "h200-32b": CostModel(H200, QWEN_32B),
}


def get_cost_model(name: str, **overrides: float) -> CostModel:
    """A preset by name (`h100-7b`, `h200-7b`, `h100-32b`, `h200-32b`), fields overridden."""
    if name not in PRESETS:
        raise ValueError(f"cost model {name!r}: allowed: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)
