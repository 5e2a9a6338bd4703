"""The split search's probes (`split_search.py` plans, this module simulates): one `SplitProber`
per `simulate` call, shared by `static`, `reference` and the start of the controller policies.

- **One probe workload, one cache**: the probe steps (`split_search.probe_steps`), their
  closed-form terms (the analytic start, the lower bounds) and every (policy, split) score are
  computed once per `simulate` call; `static`'s search is the start of `borrow`/`hysteresis`.
- **Pruned by bounds**: `lower_bound(policy, r)` is a value the probe's score at r cannot be
  below (module `bounds` below); `search_best_split` never simulates a split whose bound is
  above the best score found (same answer, fewer probes).
- **Parallel**: with `workers` > 1 (default: the usable cores, for probes of at least
  `PARALLEL_MIN_REQUEST_STEPS` request-steps) the probes run in forked processes
  (`forkmap.fork_map`: the grid `workers` at a time, the pattern search's two neighbours
  together); a score is the same number in any process, so the answer does not depend on
  `workers`.
"""

from __future__ import annotations

import math

from dynaresize.control.registry import POLICIES
from dynaresize.sim import split_search
from dynaresize.sim.costs import CostModel
from dynaresize.sim.forkmap import fork_map, usable_cores
from dynaresize.sim.harness import StepSubset, run_config, sim_config
from dynaresize.sim.oracle import rollout_device_s, tail_s, trained_tokens
from dynaresize.sim.workloads import Workload

PARALLEL_MIN_REQUEST_STEPS = 16384
"""Probes of fewer request-steps than this run in this process (a fork costs more)."""


class SplitProber:
    """Probes of one run (workload, devices, steps, staleness, seed, cost model) at fixed splits,
    scored by the run's mean step time they imply (`split_search.estimated_mean_step_s`)."""

    def __init__(self, workload: Workload, gpus: int, steps: int, staleness: int, seed: int,
                 costs: CostModel, workers: int | None = None) -> None:
        if gpus < 2:
            raise ValueError(f"gpus = {gpus}: must be >= 2 (one device per stage)")
        self.gpus, self.steps, self.staleness, self.seed, self.costs = (
            gpus, steps, staleness, seed, costs)
        self.picked = split_search.probe_steps(steps, staleness)
        self.probe = StepSubset(workload, self.picked)
        self.analytic = Analytic(costs, workload, self.picked)
        self.terms = [_StepTerms(*t) for t in self.analytic.terms]
        request_steps = sum(t.num_requests for t in self.terms)
        cores = usable_cores() if workers is None else max(1, workers)
        self.workers = cores if request_steps >= PARALLEL_MIN_REQUEST_STEPS else 1
        self._scores: dict[tuple[str, int], float] = {}
        self.num_simulated = 0

    # ------------------------------------------------------------------ the search
    def search(self, policy: str = "static") -> tuple[int, int]:
        """The best fixed split of `policy` (`static`, or a controller that never moves:
        `fixed`): (rollout devices, splits simulated for this search)."""
        start = min(range(1, self.gpus), key=lambda r: self.analytic_step_s(r))
        before = self.num_simulated
        best, _ = split_search.search_best_split(
            lambda r: self.scores(policy, [r])[0], self.gpus, start,
            lower_bound=lambda r: self.lower_bound(policy, r),
            score_many=lambda rs: self.scores(policy, rs), batch=self.workers)
        return best, self.num_simulated - before

    def scores(self, policy: str, splits: list[int]) -> list[float]:
        """The probe's score at each of `splits` (simulated once per policy and split, in up
        to `workers` forked processes)."""
        todo = [r for r in dict.fromkeys(splits) if (policy, r) not in self._scores]
        found = fork_map(lambda r: self.simulate_probe(policy, r), todo, self.workers)
        self.num_simulated += len(todo)
        self._scores.update(((policy, r), s) for r, s in zip(todo, found))
        return [self._scores[(policy, r)] for r in splits]

    def simulate_probe(self, policy: str, r: int) -> float:
        """One probe: the picked steps through the orchestrator at r rollout devices."""
        cfg = sim_config(self.probe, r, self.gpus - r, len(self.picked), self.staleness,
                         self.seed, self.costs)
        cfg.controller.policy = policy
        controller = None if policy == "static" else POLICIES[policy](cfg)
        run = run_config(cfg, self.probe, self.costs, controller)
        return split_search.estimated_mean_step_s([m["step_s"] for m in run.rundir.metrics],
                                                  self.staleness, self.steps)

    # ------------------------------------------------------------------ closed forms
    def analytic_step_s(self, r: int) -> float:
        """`run.analytic_step_s` at r rollout devices (the search's start)."""
        return self.analytic(self.gpus, r, self.staleness)

    def lower_bound(self, policy: str, r: int) -> float:
        """A value the probe's score at r cannot be below (`step_bounds`, weighted as
        `estimated_mean_step_s` weighs the probe's steps)."""
        first, rest = step_bounds(self.costs, self.terms, self.gpus, r, self.staleness,
                                  streaming=policy != "static")
        num = len(self.terms)
        fill = min(self.staleness, num - 1)
        if fill == 0:  # the score is the probe's mean step
            return (first + rest) / num
        # one fill step counted once, the others' mean for the remaining steps of the run
        return (first + (self.steps - 1) * rest / (num - 1)) / self.steps


class Analytic:
    """`run.analytic_step_s` with the split-independent terms of each step computed once."""

    def __init__(self, costs: CostModel, workload: Workload, steps: list[int]) -> None:
        self.costs = costs
        self.terms = []
        for k in steps:
            req = workload.step_requests(k)
            self.terms.append((req.num_requests, int(req.response_tokens.max()),
                               tail_s(costs, req), rollout_device_s(costs, req),
                               trained_tokens(req)))
        self._tail_at_batch: dict[tuple[int, int], float] = {}

    def _tail_at(self, longest: int, batch: int) -> float:
        key = (longest, batch)
        if key not in self._tail_at_batch:
            self._tail_at_batch[key] = self.costs.decode_span_s(longest, batch, 0)
        return self._tail_at_batch[key]

    def __call__(self, gpus: int, num_rollout: int, staleness: int) -> float:
        costs = self.costs
        total_s = 0.0
        for num_requests, longest, alone_s, device_s, tokens in self.terms:
            batch = min(costs.max_running_requests, -(-num_requests // num_rollout))
            tail_at_batch_s = self._tail_at(longest, max(1, batch // 2))
            roll_s = max(alone_s, tail_at_batch_s, device_s / num_rollout)
            train_s = costs.train_step_s(tokens, gpus - num_rollout) + costs.weight_sync_s()
            total_s += max(roll_s, train_s) if staleness else roll_s + train_s
        return total_s / len(self.terms)


class _StepTerms:
    """A probe step's split-independent terms."""

    __slots__ = ("num_requests", "longest", "alone_s", "device_s", "tokens")

    def __init__(self, num_requests: int, longest: int, alone_s: float, device_s: float,
                 tokens: int) -> None:
        self.num_requests, self.longest, self.alone_s = num_requests, longest, alone_s
        self.device_s, self.tokens = device_s, tokens


def step_bounds(costs: CostModel, terms: list[_StepTerms], gpus: int, r: int, staleness: int,
                streaming: bool) -> tuple[float, float]:
    """Lower bounds of a fixed-split run's first step and of the sum of its other steps, at r
    rollout devices and `gpus` - r trainers. A step ends when its weights are published
    (`step_s` is the time since the previous step's end), and the training of step k runs on
    the N - r trainers between the ends of steps k - 1 and k: every step takes at least its
    `train_step_s` on N - r ranks plus the publish latency (the busiest rank trains at least
    the mean share of the tokens). The first step takes at least its slowest request alone
    plus the optimizer step and the publish (plus its whole rollout, at least its
    device-seconds / r, when training does not stream). The rollouts of steps k >= 1 +
    staleness start after the first step's end (they need version k - staleness) and end
    before the run does, on r devices: the other steps take at least their rollout
    device-seconds (`oracle.rollout_device_s`, a lower bound) / r in all; at staleness 0
    without streaming every step also takes its rollout and its training one after the
    other."""
    publish_s = costs.weight_sync_latency_s
    train = [costs.train_step_s(t.tokens, gpus - r) + publish_s for t in terms]
    head = terms[0]
    first = max(train[0], head.alone_s + costs.train_step_overhead_s + publish_s)
    if not streaming:
        first = max(first, max(head.alone_s, head.device_s / r) + train[0])
    rest = max(sum(train[1:]), sum(t.device_s for t in terms[1 + staleness:]) / r)
    if staleness == 0 and not streaming:
        rest = max(rest, sum(max(t.alone_s, t.device_s / r) + s
                             for t, s in zip(terms[1:], train[1:])))
    return first, rest if math.isfinite(rest) else 0.0
