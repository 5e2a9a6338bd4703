"""Workloads of the digital twin: synthetic presets from published statistics (traces:
`sim.traces`).

A workload says, for every request `(step, prompt, sample)`, how many prompt tokens it has
and how many tokens its response will have. Every generator is deterministic in
`(seed, step)`; steps can be drawn in any order.

Synthetic lengths are log-normal with a per-prompt component, so a group's samples are
correlated as real prompts' are (hard prompts give long answers to every sample)::

    log L[p, s] = log(median * 2 ** (step / doubling_steps)) + g[p] + e[p, s]
    g ~ N(0, sigma^2 * rho),  e ~ N(0, sigma^2 * (1 - rho)),  L capped at max_response_tokens

Presets (`get_workload(name)`):

- `dapo-7b`: DAPO-like math RL on a 7B model (Yu et al. 2025, "DAPO", arXiv:2503.14476:
  512 prompts x 16 samples, 16k response cap, lengths growing during training). Median 1,640
  tokens and sigma 1.22 put p99 at the cap, about 10x the median, with ~3% of responses
  truncated at 16,384; the median grows 2x every 70 steps.
- `balanced`: short, tight lengths (median 500, sigma 0.15, cap 1,024); no tail.
- `agentic`: multi-turn-like: long prompts (median 4,000 tokens of history), bimodal responses
  (a short tool call of ~300 tokens or a long reasoning turn of ~4,000), the long-turn
  probability drawn per prompt from Beta(2, 3).
- `drift`: the `dapo-7b` shape with the median doubling every 25 steps (x4 over 50 steps).
- `agentic-turns` (`sim.resolve.resolve_workload` only): `agentic`'s batch and lengths as multi-turn
  episodes, a turn per request and tool waits between turns (`sim.episodes`).

Traces (`sim.traces.load_trace`): JSON Lines in the design §5 format, validated line by line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class StepRequests:
    """All requests of one step: row-major over (prompt, sample), arrays of shape [P, S]."""

    step: int
    response_tokens: np.ndarray
    """int64 [num_prompts, samples_per_prompt]."""
    prompt_tokens: np.ndarray
    """int64 [num_prompts]: one prompt, so one length, per group."""

    @property
    def num_requests(self) -> int:
        return int(self.response_tokens.size)

    def to_dicts(self) -> list[dict[str, int]]:
        """One `{"step","prompt","sample","response_tokens","prompt_tokens"}` per request."""
        num_prompts, num_samples = self.response_tokens.shape
        return [{"step": self.step, "prompt": p, "sample": s,
                 "response_tokens": int(self.response_tokens[p, s]),
                 "prompt_tokens": int(self.prompt_tokens[p])}
                for p in range(num_prompts) for s in range(num_samples)]


class Workload:
    """Interface: `step_requests(step)`, `requests(step)`, `response_tokens(key)`."""

    name: str
    prompts_per_step: int
    samples_per_prompt: int
    max_response_tokens: int
    num_steps: int | None
    """Steps available (traces); None for synthetic workloads (unbounded)."""

    def step_requests(self, step: int) -> StepRequests:
        raise NotImplementedError

    def requests(self, step: int) -> list[dict[str, int]]:
        return self.step_requests(step).to_dicts()

    def response_tokens(self, step: int, prompt: int, sample: int) -> int:
        return int(self.step_requests(step).response_tokens[prompt, sample])

    def prompt_tokens(self, step: int, prompt: int) -> int:
        return int(self.step_requests(step).prompt_tokens[prompt])


@dataclass(frozen=True)
class SyntheticWorkload(Workload):
    """Log-normal (optionally bimodal) lengths; see the module docstring for the model."""

    name: str
    prompts_per_step: int
    samples_per_prompt: int
    max_response_tokens: int
    median_response_tokens: float
    sigma: float
    """Std-dev of log length (whole population)."""
    group_rho: float = 0.5
    """Share of log-length variance common to a prompt's samples."""
    doubling_steps: float = 0.0
    """Median doubles every this many steps; 0: no drift."""
    median_prompt_tokens: float = 150.0
    prompt_sigma: float = 0.4
    long_median_response_tokens: float = 0.0
    """> 0: bimodal; a sample is 'long' with a per-prompt probability ~ Beta(2, 3)."""
    seed: int = 0
    num_steps: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "_cache", {})

    def step_requests(self, step: int) -> StepRequests:
        cache: dict[int, StepRequests] = self._cache  # type: ignore[attr-defined]
        if step not in cache:
            if len(cache) > 4:
                cache.clear()
            cache[step] = self._generate(step)
        return cache[step]

    def _generate(self, step: int) -> StepRequests:
        rng = np.random.default_rng([self.seed, step, 0x5EED])
        num_p, num_s = self.prompts_per_step, self.samples_per_prompt
        drift = 2.0 ** (step / self.doubling_steps) if self.doubling_steps > 0 else 1.0
        group = rng.normal(0.0, self.sigma * np.sqrt(self.group_rho), size=(num_p, 1))
        own = rng.normal(0.0, self.sigma * np.sqrt(1.0 - self.group_rho), size=(num_p, num_s))
        median = np.full((num_p, num_s), self.median_response_tokens * drift)
        if self.long_median_response_tokens > 0:
            p_long = rng.beta(2.0, 3.0, size=(num_p, 1))
            is_long = rng.random((num_p, num_s)) < p_long
            median = np.where(is_long, self.long_median_response_tokens * drift, median)
        lengths = np.exp(np.log(median) + group + own)
        response = np.clip(np.rint(lengths), 1, self.max_response_tokens).astype(np.int64)
        prompts = np.exp(np.log(self.median_prompt_tokens)
                         + rng.normal(0.0, self.prompt_sigma, size=num_p))
        return StepRequests(step, response, np.maximum(1, np.rint(prompts)).astype(np.int64))


PRESETS: dict[str, SyntheticWorkload] = {
    "dapo-7b": SyntheticWorkload("dapo-7b", 512, 16, 16384, 1640.0, 1.22, group_rho=0.5,
                                 doubling_steps=70.0, median_prompt_tokens=150.0),
    "balanced": SyntheticWorkload("balanced", 512, 16, 1024, 500.0, 0.15, group_rho=0.5,
                                  median_prompt_tokens=200.0, prompt_sigma=0.2),
    "agentic": SyntheticWorkload("agentic", 256, 8, 16384, 300.0, 0.5, group_rho=0.3,
                                 median_prompt_tokens=4000.0, prompt_sigma=0.5,
                                 long_median_response_tokens=4000.0),
    "drift": SyntheticWorkload("drift", 512, 16, 16384, 1000.0, 1.0, group_rho=0.5,
                               doubling_steps=25.0),
}


def get_workload(name: str, *, seed: int = 0, prompts_per_step: int | None = None,
                 samples_per_prompt: int | None = None,
                 requests_per_step: int | None = None, **overrides: Any) -> SyntheticWorkload:
    """A preset by name, reseeded and rescaled.

    `requests_per_step` (e.g. 8192) sets `prompts_per_step = requests_per_step //
    samples_per_prompt`; it must be a multiple of the group size.
    """
    if name not in PRESETS:
        raise ValueError(f"workload {name!r}: allowed: {', '.join(PRESETS)}, agentic-turns "
                         "or a .jsonl trace")
    wl = replace(PRESETS[name], seed=seed, **overrides)
    if samples_per_prompt is not None:
        wl = replace(wl, samples_per_prompt=samples_per_prompt)
    if requests_per_step is not None:
        if requests_per_step <= 0 or requests_per_step % wl.samples_per_prompt:
            raise ValueError(f"requests_per_step = {requests_per_step}: must be a positive "
                             f"multiple of samples_per_prompt = {wl.samples_per_prompt}")
        prompts_per_step = requests_per_step // wl.samples_per_prompt
    if prompts_per_step is not None:
        if prompts_per_step <= 0:
            raise ValueError(f"prompts_per_step = {prompts_per_step}: must be > 0")
        wl = replace(wl, prompts_per_step=prompts_per_step)
    return wl


class FilteredWorkload(Workload):
    """DAPO dynamic sampling in the twin (`train.dynamic_sampling`): `inner` holds each
    step's prompt POOL (batch_prompts x max_rounds prompts, `core.dynamic_sampling`); the
    step trains `batch_prompts` groups. A group has a reward signal (rewards not all equal)
    with probability 1 - the step's filter rate, drawn per (seed, step, prompt); the rate is
    one number or one per step (e.g. `drawn_filter_rates`, or read from a run's records).
    The run tops the step up live as groups finish (`core.dynamic_sampling.TopUp`; `margin`:
    `train.dynamic_sampling.margin`)."""

    def __init__(self, inner: Workload, batch_prompts: int, max_rounds: int,
                 filter_rates: float | tuple[float, ...], seed: int = 0,
                 margin: float = 1.0) -> None:
        if inner.prompts_per_step != batch_prompts * max_rounds:
            raise ValueError(f"the pool workload has {inner.prompts_per_step} prompts per "
                             f"step, expected {batch_prompts} x {max_rounds}")
        rates = filter_rates if isinstance(filter_rates, tuple) else (float(filter_rates),)
        if not rates or any(not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"filter rates must be in [0, 1], got {filter_rates!r}")
        self._inner, self._rates, self._seed = inner, rates, seed
        self.name = inner.name
        self.prompts_per_step = batch_prompts
        self.samples_per_prompt = inner.samples_per_prompt
        self.max_response_tokens = inner.max_response_tokens
        self.num_steps = inner.num_steps
        self.max_rounds = max_rounds
        self.margin = margin

    def step_requests(self, step: int) -> StepRequests:
        return self._inner.step_requests(step)

    def filter_rate(self, step: int) -> float:
        return self._rates[step % len(self._rates)]

    def group_has_signal(self, step: int, prompt: int) -> bool:
        draw = np.random.default_rng([self._seed, step, prompt, 0xF117]).random()
        return bool(draw >= self.filter_rate(step))


def drawn_filter_rates(low: float, high: float, steps: int, seed: int = 0
                       ) -> tuple[float, ...]:
    """Per-step filter rates drawn uniformly in [low, high] (seeded)."""
    rng = np.random.default_rng([seed, 0xF1]).uniform(low, high, size=steps)
    return tuple(float(r) for r in rng)
