"""The `oracle` baseline: a true lower bound on each step's time (issue 4), resizes free.

For a step on `N` devices under cost model `c`, with staleness `s`:

(a) *tail*: the step's slowest request alone on an otherwise empty device: its prefill plus
    its decode at batch 1, `c.prefill_s(prompt) + c.decode_span_s(L, 1, prompt)`.
(b) *work*: all of the step's device-seconds at each stage's best per-device efficiency,
    divided by `N`:

    - rollout: any schedule with at most `B = c.max_running_requests` requests per iteration
      runs at least `I = ceil(tokens / B)` iterations; every iteration reads the weights once
      and every generated token reads its whole KV context once (`K` = sum over requests of
      `L * prompt + L * (L - 1) / 2` KV tokens, fixed by the workload), and the FLOPs are
      `2 * params * tokens`. Since a sum of maxima is at least the maximum of the sums:
      `rollout >= I * overhead + max((I * weights + K * kv) / bw, 2 * params * tokens / flops)
      + sum of prefills`.
    - training: `trained_tokens * c.train_token_s()` (data-parallel efficiency 1) plus one
      `train_step_overhead_s`.

What staleness forces: step k + 1 + s's rollout needs version k + 1, i.e. step k's last
sample (its tail), the optimizer step and a weight sync, so `1 + s` step periods cover at least
`tail + train_step_overhead_s + weight_sync`: (a) becomes that sum divided by `1 + s`.

- `s = 0` (on-policy): (b) also gains `weight_sync` (nothing else overlaps it). Training does
  *not* serialise after the tail: it streams over the step's completed groups while the tail
  runs, so only the optimizer step is forced after it. (Until 2026-12-03 (a) added the whole
  training step at staleness 0; a streaming run of `agentic` on 32 GPUs came in at 0.966x
  that "bound".)
- `s >= 1`: training of step k-1 overlaps rollout of step k, and step k + 1's rollout may
  start during step k's tail (pipelined rollouts, `orchestrator_rollout`); the bound is the
  steady-state `max(a, b)` (the pipeline's fill and drain are ignored).

With speculation (`CostModel.speculation`), (a) takes each request's decode at its best
budget (`spec_alone_s`, the iterations the twin's engines draw for it) and (b)'s iterations
accept the distribution's mean at the deepest budget (`ceil(tokens / (B * mean))`; the FLOPs
term is unchanged: every accepted token is computed at least once).

A step is *tail-bound* when (a) binds, *work-bound* when (b) does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynaresize.sim.costs import CostModel
from dynaresize.sim.speculation import request_iterations
from dynaresize.sim.workloads import StepRequests, Workload


@dataclass(frozen=True)
class OracleStep:
    """The bound of one step and its parts (seconds)."""

    step: int
    step_s: float
    tail_s: float
    """(a), including what staleness forces."""
    work_s: float
    """(b), including what staleness forces."""
    rollout_device_s: float
    train_device_s: float
    num_samples: int
    num_response_tokens: int

    @property
    def binds(self) -> str:
        return "tail-bound" if self.tail_s >= self.work_s else "work-bound"


def rollout_device_s(costs: CostModel, req: StepRequests) -> float:
    """Lower bound on the device-seconds of the step's rollout (module docstring, (b))."""
    lengths = req.response_tokens.astype(np.float64)
    prompts = np.broadcast_to(req.prompt_tokens[:, None], lengths.shape).astype(np.float64)
    tokens = float(lengths.sum())
    spec = costs.speculation
    per_iteration = 1.0 if spec is None else spec.mean_accepted
    num_iters = np.ceil(tokens / (costs.max_running_requests * per_iteration))
    kv_reads = float((lengths * prompts + lengths * (lengths - 1) / 2.0).sum())
    bw = costs.gpu.hbm_bytes_per_s * costs.decode_bw_efficiency
    mem_s = (num_iters * costs.model.weight_bytes + kv_reads * costs.model.kv_bytes_per_token) / bw
    comp_s = 2.0 * costs.model.num_params * tokens / (costs.gpu.bf16_flops_per_s * costs.decode_mfu)
    return float(num_iters * costs.iteration_overhead_s + max(mem_s, comp_s)
                 + costs.prefill_s(int(prompts.sum())))


def tail_s(costs: CostModel, req: StepRequests) -> float:
    """(a): the slowest request of the step alone on an empty device (prefill + decode)."""
    lengths = req.response_tokens
    prompts = np.broadcast_to(req.prompt_tokens[:, None], lengths.shape)
    per_request = costs.decode_span_s(lengths, 1, prompts) + costs.prefill_s(1) * prompts
    if costs.speculation is not None:
        per_request = np.minimum(per_request, spec_alone_s(costs, req) + costs.prefill_s(1)
                                 * prompts)
    return float(np.max(per_request))


def spec_alone_s(costs: CostModel, req: StepRequests) -> np.ndarray:
    """Every request's decode alone with speculation at the budget best for it (the same
    iterations `SpecEngine` draws for it at each budget)."""
    spec = costs.speculation
    lengths = np.maximum(1.0, req.response_tokens.astype(np.float64))
    prompts = np.broadcast_to(req.prompt_tokens[:, None], lengths.shape).astype(np.float64)
    bw, kv, w, comp_per_request_s = costs.hot_terms  # type: ignore[attr-defined]
    best = np.full(lengths.shape, np.inf)
    for p in spec.levels:
        n = request_iterations(spec, req.step, lengths, p)
        growth = lengths / n
        comp_s = comp_per_request_s * p
        cross = (comp_s * bw - w) / kv
        first_mem = np.minimum(n, np.maximum(0.0, np.ceil((cross - prompts) / growth)))
        m = n - first_mem
        mem_sum_s = (m * (w + prompts * kv) + growth * kv * (first_mem + n - 1) * m / 2.0) / bw
        best = np.minimum(best, n * costs.iteration_overhead_s + first_mem * comp_s + mem_sum_s)
    return best


def trained_tokens(req: StepRequests) -> int:
    """Tokens the trainer processes: prompt + response of every sample."""
    num_samples = req.response_tokens.shape[1]
    return int(req.response_tokens.sum() + num_samples * req.prompt_tokens.sum())


def oracle_step(costs: CostModel, req: StepRequests, num_devices: int,
                staleness: int) -> OracleStep:
    """The lower bound of one step on `num_devices` devices (module docstring)."""
    if num_devices <= 0:
        raise ValueError(f"num_devices = {num_devices}: must be > 0")
    tokens = trained_tokens(req)
    roll_s = rollout_device_s(costs, req)
    train_s = tokens * costs.train_token_s() + costs.train_step_overhead_s
    a_s = (tail_s(costs, req) + costs.train_step_overhead_s + costs.weight_sync_s()) \
        / (1 + staleness)
    b_s = (roll_s + train_s) / num_devices
    if staleness == 0:
        b_s += costs.weight_sync_s()
    return OracleStep(req.step, max(a_s, b_s), a_s, b_s, roll_s, train_s,
                      req.num_requests, int(req.response_tokens.sum()))


def work_samples_per_s(steps: list[OracleStep]) -> float:
    """The oracle's work bound: samples per second if every step took only its work term
    (every device at full-batch efficiency, no tail). Not in `simulate`'s rows (their JSON
    stays as it was); `bench/tail_async.py` adds it to its oracle rows."""
    return sum(s.num_samples for s in steps) / sum(s.work_s for s in steps)


def oracle_steps(costs: CostModel, workload: Workload, num_devices: int, num_steps: int,
                 staleness: int) -> list[OracleStep]:
    """`oracle_step` for steps 0..num_steps-1 of `workload`."""
    return [oracle_step(costs, workload.step_requests(k), num_devices, staleness)
            for k in range(num_steps)]


def oracle_result(steps: list[OracleStep]) -> dict[str, object]:
    """A `results` row of `simulate` (issue 4's JSON shape) plus the tail/work counts."""
    step_s = np.array([s.step_s for s in steps])
    total_s = float(step_s.sum())
    num_tail = sum(s.binds == "tail-bound" for s in steps)
    return {
        "policy": "oracle",
        "split": None,
        "mean_step_s": float(step_s.mean()),
        "p99_step_s": float(np.percentile(step_s, 99)),
        "samples_per_s": sum(s.num_samples for s in steps) / total_s,
        "tokens_per_s": sum(s.num_response_tokens for s in steps) / total_s,
        "bubble_fraction": 0.0,
        "idle_device_s_per_step": 0.0,
        "num_resizes": 0,
        "tail_bound_steps": num_tail,
        "work_bound_steps": len(steps) - num_tail,
        "binds": "tail-bound" if num_tail * 2 > len(steps) else "work-bound",
    }
