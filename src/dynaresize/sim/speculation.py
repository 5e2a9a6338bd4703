"""Speculative decoding in the twin: what a verify iteration costs and how many tokens it
accepts (issue 25).

A verify iteration of `b` requests checking `p` positions each (the last accepted token plus
`p - 1` drafted ones) reads the weights and the KV cache once (the memory term) and computes
`b * p` positions (the compute term)::

    t = overhead + max((weight_bytes + ctx * kv_bytes_per_token) / (HBM_bw * bw_eff),
                       2 * params * b * p / (FLOPs * decode_mfu))

It accepts `min(A, p)` tokens per request, `A` drawn from the `Speculation`'s distribution
(`A >= 1`: the token our sampler draws at the first unmatched position always counts, as in
exact speculative decoding). The budget `p` is length- and load-aware as DAS's: an engine
picks, from `levels`, the `p` that makes the most tokens per second at its batch and context
(`best_level`): no drafting where the compute of the extra positions costs more than they
save (full batches, compute-bound), deep drafts for the lightly loaded tail.

Per request, the iterations its `L` tokens need at budget `p` are a renewal count of `L`
over draws of `min(A, p)`: normal with mean `L / mu_p` and variance `L sigma_p^2 / mu_p^3`
(one standard normal `z` per request, shared by every level, seeded by (seed, step), so a
request's speed is a function of the run's seed and its own identity only, never of the
allocation), at least `ceil(L / p)` and at most `L`. Its tokens advance linearly over those
iterations (`SpecEngine`).

Distributions: `das` (the preset: a truncated geometric, per-token acceptance 0.6 over drafts
of up to 7 tokens, mean 2.4 accepted tokens per iteration: DAS, arXiv 2511.13841, reports up to
50% less rollout time but no per-iteration histogram this project could read; the preset is
our assumption, sized to that headline) and a calibrated one read from JSON
(`{"accepted_per_iteration": {"1": count, "2": count, ...}}`, e.g. docs/data/spec_acceptance.json
written from live runs).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

LEVELS = (1, 2, 3, 5, 8)
"""Verified positions per request an engine may pick (1: plain decoding)."""


@dataclass(frozen=True)
class Speculation:
    """Accepted tokens per verify iteration: `probs[a - 1]` = P(A = a), a = 1..len(probs)."""

    name: str
    probs: tuple[float, ...]
    levels: tuple[int, ...] = LEVELS
    seed: int = 0
    _moments: dict[int, tuple[float, float]] = field(default_factory=dict, compare=False,
                                                     repr=False)

    def moments(self, p: int) -> tuple[float, float]:
        """(mean, variance) of min(A, p)."""
        got = self._moments.get(p)
        if got is None:
            a = np.minimum(np.arange(1, len(self.probs) + 1), p).astype(float)
            pr = np.asarray(self.probs)
            mean = float((a * pr).sum())
            got = self._moments[p] = (mean, float(((a - mean) ** 2 * pr).sum()))
        return got

    @property
    def mean_accepted(self) -> float:
        return self.moments(len(self.probs))[0]

    def iterations(self, tokens: np.ndarray, z: np.ndarray, p: int) -> np.ndarray:
        """Verify iterations `tokens` need at budget `p` (see the module doc), >= 1."""
        mu, var = self.moments(p)
        n = tokens / mu + z * np.sqrt(tokens * var / mu ** 3)
        lo = np.ceil(tokens / max(1, min(p, len(self.probs))))
        return np.maximum(1.0, np.clip(np.rint(n), lo, np.maximum(tokens, 1)))


def geometric(name: str, accept: float, max_draft: int) -> Speculation:
    """A drafter whose k-th drafted token is accepted with probability `accept` given the
    ones before it were, drafting `max_draft` tokens: A = 1 + accepted drafted tokens."""
    probs = [(accept ** k) * ((1 - accept) if k < max_draft else 1.0)
             for k in range(max_draft + 1)]
    return Speculation(name, tuple(probs))


PRESETS: dict[str, Speculation] = {"das": geometric("das", 0.6, 7)}


def load_acceptance(path: str | Path) -> Speculation:
    """A calibrated distribution from a JSON histogram (module doc); ValueError naming the
    file and field for bad input."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the acceptance histogram: {exc}") from exc
    hist = data.get("accepted_per_iteration") if isinstance(data, dict) else None
    if not isinstance(hist, dict) or not hist:
        raise ValueError(f"{path}: field 'accepted_per_iteration' must be a non-empty object "
                         "{\"1\": count, \"2\": count, ...}")
    counts: dict[int, float] = {}
    for key, value in hist.items():
        if not str(key).isdigit() or int(key) < 1 or isinstance(value, bool) \
                or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{path}: field 'accepted_per_iteration' entry {key!r} = "
                             f"{value!r}: keys are integers >= 1, counts >= 0")
        counts[int(key)] = float(value)
    total = sum(counts.values())
    if total <= 0:
        raise ValueError(f"{path}: field 'accepted_per_iteration': every count is 0")
    top = max(counts)
    return Speculation(f"calibrated:{Path(path).name}",
                       tuple(counts.get(a, 0.0) / total for a in range(1, top + 1)))


def resolve_speculation(value: str | None) -> Speculation | None:
    """`off` / None -> None, a preset name, or a JSON histogram file."""
    if value is None or value == "off":
        return None
    if value in PRESETS:
        return PRESETS[value]
    if not Path(value).is_file():
        raise ValueError(f"speculation = {value!r}: allowed: off, {', '.join(PRESETS)} or a "
                         "JSON histogram file ({\"accepted_per_iteration\": {...}})")
    return load_acceptance(value)


def best_level(spec: Speculation, comp_per_request_s: float, batch: int, mem_s: float,
               overhead_s: float) -> int:
    """The budget with the most tokens per second at this batch and memory term (ties: the
    smaller)."""
    best, best_rate = 1, 1.0 / (overhead_s + max(mem_s, comp_per_request_s * batch))
    for p in spec.levels[1:]:
        rate = spec.moments(p)[0] / (overhead_s + max(mem_s, comp_per_request_s * batch * p))
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = p, rate
    return best


def request_iterations(spec: Speculation, step: int, tokens: np.ndarray, p: int) -> np.ndarray:
    """Verify iterations of every request of `step` (`tokens`: [prompt][sample]) at budget
    `p`; one standard normal per request, seeded by (speculation seed, step)."""
    if p == 1:
        return np.maximum(1.0, tokens)
    z = np.random.default_rng((spec.seed, 25, step)).standard_normal(np.shape(tokens))
    return spec.iterations(tokens, z, p)


class SpecTable:
    """Per step, every request's tokens per verify iteration at each level (shared by a run's
    devices, like `Lengths`), and what the run's engines accepted (`stats`)."""

    def __init__(self, spec: Speculation, lengths: Any) -> None:
        self.spec = spec
        self._lengths = lengths
        self._steps: dict[int, dict[int, list[list[float]]]] = {}
        self.spec_tokens = 0.0
        """Tokens generated by speculating iterations (budget > 1)."""
        self.spec_request_iters = 0
        """Request-iterations of speculating iterations."""
        self.plain_request_iters = 0

    def rates(self, step: int, p: int) -> list[list[float]]:
        """Tokens per iteration [prompt][sample] of `step` at budget `p`."""
        table = self._steps.get(step)
        if table is None:
            if len(self._steps) >= 4:
                self._steps.clear()
            table = self._steps[step] = {}
        got = table.get(p)
        if got is None:
            responses, _ = self._lengths(step)
            tokens = np.maximum(1.0, np.asarray(responses, dtype=np.float64))
            got = table[p] = (tokens / request_iterations(self.spec, step, tokens, p)).tolist()
        return got

    def stats(self) -> dict[str, Any]:
        iters = self.spec_request_iters
        return {"speculation": self.spec.name,
                "accepted_per_iteration": round(self.spec_tokens / iters, 3) if iters else None,
                "speculating_share": round(iters / max(1, iters + self.plain_request_iters), 4)}


def spec_span_s(costs: Any, n: int, comp_s: float, growth: float, c0: float) -> float:
    """`n` iterations with compute term `comp_s` each and the KV context growing by `growth`
    tokens per iteration from `c0` (`CostModel.span_scalar_s` with the two decoupled)."""
    if n <= 0:
        return 0.0
    bw, kv, w, _ = costs.hot_terms
    first_mem = min(n, max(0, math.ceil(((comp_s * bw - w) / kv - c0) / max(growth, 1e-9))))
    m = n - first_mem
    mem_sum_s = (m * (w + c0 * kv) + growth * kv * (first_mem + n - 1) * m / 2.0) / bw
    return n * costs.iteration_overhead_s + first_mem * comp_s + mem_sum_s


def spec_iters_within(costs: Any, budget_s: float, comp_s: float, growth: float,
                      c0: float) -> int:
    """Largest `n` with `spec_span_s(n) <= budget_s` (binary search; spans grow in n)."""
    if spec_span_s(costs, 1, comp_s, growth, c0) > budget_s:
        return 0
    lo, hi = 1, 2
    while spec_span_s(costs, hi, comp_s, growth, c0) <= budget_s:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if spec_span_s(costs, mid, comp_s, growth, c0) <= budget_s:
            lo = mid
        else:
            hi = mid
    return lo
