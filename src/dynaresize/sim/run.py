"""`simulate`: every policy on one workload, the unchanged `Orchestrator` on `SimDevice`s.

Policies (`simulate(policies=...)`):

- `static`: the best split in hindsight, searched (`split_search.py`): a probe (3 +
  staleness steps spread over the run, scored by the run's mean step time it implies)
  simulated at a grid of every N/8-th split and at the closed-form optimum
  (`analytic_step_s`, from the oracle's per-step terms), then a pattern search from the
  grid's best (step to the better neighbour while it improves, halving the spacing down to
  max(1, N/128)); finally the whole run at the best split.
- `oracle`: the lower bound of `oracle.py` (resizes free, clairvoyant).
- `reference`: what users could configure by hand, non-clairvoyant: the `fixed` policy
  (`dynaresize.control.fixed`: one split, streaming training, pipelined rollouts at staleness
  >= 1) at its best split, searched like `static`'s.
- `colocated`: `colocated.py` (all devices roll out, then all train, with the switch cost).
- `fully-async`: `fully_async.py`, verl's / AReaL's fully-async mode at the run's staleness
  bound (partial rollouts across weight updates, groups trained in completion order): it
  **changes the semantics**, the competitor to report against; its split searched on a grid.
  Its requests re-prefill their context after each weight update, as AReaL's and slime's do;
  `fully-async-keep-kv` keeps the KV instead (an upper bound on the competitor).
- any other policy of the registry (`dynaresize.control.registry`: `borrow`, `fixed`, `hysteresis`):
  the orchestrator with that controller, starting from the best static split (searched once,
  shared with `static`).

Each row is issue 4's `{"policy","split","mean_step_s","p99_step_s","samples_per_s",
"tokens_per_s","bubble_fraction","num_resizes"}` plus extras. With `out_dir`, every simulated
policy writes a live-like run directory to `out_dir/<policy>/`.

`faults` (`TwinFaults`: `[[faults.kill]]` entries, checkpoints) apply to the final run of each
orchestrator policy (not to the split search's probes); `colocated` and `oracle` are not the
orchestrator and refuse them. Their rows gain `num_faults`, `recovery_s`, `replayed_steps`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from dynaresize.config.validate import MAX_STALENESS
from dynaresize.control.registry import POLICIES
from dynaresize.sim.colocated import run_colocated
from dynaresize.sim.costs import CostModel, get_cost_model
from dynaresize.sim.forkmap import fork_map, usable_cores
from dynaresize.sim.fully_async import run_fully_async, search_fully_async
from dynaresize.sim.harness import TwinFaults, run_config, sim_config
from dynaresize.sim.oracle import (
    oracle_result,
    oracle_steps,
)
from dynaresize.sim.probes import PARALLEL_MIN_REQUEST_STEPS, Analytic, SplitProber
from dynaresize.sim.resolve import resolve_workload
from dynaresize.sim.results_row import results_row
from dynaresize.sim.speculation import Speculation, resolve_speculation
from dynaresize.sim.workloads import Workload

BUILTIN_POLICIES = ("static", "colocated", "reference", "fully-async", "fully-async-keep-kv",
                    "oracle")
NOT_ORCHESTRATOR = ("colocated", "fully-async", "fully-async-keep-kv", "oracle")
"""Policies that do not run the orchestrator (no device deaths, no checkpoints)."""

FULLY_ASYNC_PROBE_STEPS = 8
"""Steps of each split `fully-async`'s search simulates (from the run's start)."""


def load_policies() -> tuple[str, ...]:
    """Every policy name `simulate` accepts: its baselines, then the registry's."""
    controllers = tuple(p for p in sorted(POLICIES) if p not in BUILTIN_POLICIES)
    return BUILTIN_POLICIES + controllers


def default_policies() -> tuple[str, ...]:
    """static, colocated, borrow, hysteresis (if registered), reference and oracle."""
    known = load_policies()
    return tuple(p for p in ("static", "colocated", "borrow", "hysteresis", "reference",
                             "oracle") if p in known)


def _sub(out_dir: str | Path | None, policy: str) -> Path | None:
    return Path(out_dir) / policy if out_dir is not None else None


def run_static(workload: Workload, gpus: int, num_rollout: int, steps: int, staleness: int,
               seed: int, costs: CostModel, out_dir: str | Path | None = None,
               faults: TwinFaults | None = None) -> dict[str, Any]:
    """One orchestrator run at a fixed split; returns its results row."""
    cfg = sim_config(workload, num_rollout, gpus - num_rollout, steps, staleness, seed, costs,
                     faults)
    run = run_config(cfg, workload, costs, out_dir=out_dir)
    return results_row("static", run, {"rollout": num_rollout, "train": gpus - num_rollout})


def analytic_step_s(costs: CostModel, workload: Workload, steps: list[int], gpus: int,
                    num_rollout: int, staleness: int) -> float:
    """Closed-form estimate of the mean step time at a split (the coarse level of the
    search): rollout = max(slowest request alone, the slowest request at half the per-engine
    batch, rollout device-seconds / R), training =
    `train_step_s` on N - R ranks plus a weight sync; their max (staleness 1) or sum (0)."""
    return Analytic(costs, workload, steps)(gpus, num_rollout, staleness)


def search_split(workload: Workload, gpus: int, steps: int, staleness: int, seed: int,
                 costs: CostModel, policy: str = "static", workers: int | None = None
                 ) -> tuple[int, int]:
    """The best static split of `policy` (`static`, or a controller that never moves:
    `fixed`), searched by `split_search.search_best_split` over probes of
    `split_search.probe_steps` (3 + staleness steps), pruned by their lower bounds and run in
    `workers` processes (`probes.SplitProber`; default: the usable cores). Returns (best
    number of rollout devices, number of splits simulated)."""
    return SplitProber(workload, gpus, steps, staleness, seed, costs, workers).search(policy)


def run_policy(policy: str, workload: Workload, gpus: int, num_rollout: int, steps: int,
               staleness: int, seed: int, costs: CostModel,
               out_dir: str | Path | None = None, faults: TwinFaults | None = None
               ) -> dict[str, Any]:
    """A registered controller policy through the orchestrator, from `num_rollout` devices."""
    cfg = sim_config(workload, num_rollout, gpus - num_rollout, steps, staleness, seed, costs,
                     faults)
    cfg.controller.policy = policy
    run = run_config(cfg, workload, costs, POLICIES[policy](cfg), out_dir)
    row = results_row(policy, run, {"rollout": num_rollout, "train": gpus - num_rollout})
    row["split_is_initial"] = True
    return row


def _checked_policies(policies: tuple[str, ...] | None, faults: bool) -> tuple[str, ...]:
    """The policies to run (default: `default_policies()`); ValueError for an unknown one
    (with faults: only the orchestrator's policies)."""
    known = load_policies()
    if faults:
        known = tuple(p for p in known if p not in NOT_ORCHESTRATOR)
    policies = tuple(policies) if policies is not None else tuple(
        p for p in default_policies() if p in known)
    unknown = [p for p in policies if p not in known]
    if unknown:
        why = " (with faults: the orchestrator's policies)" if faults else ""
        raise ValueError(f"policy {unknown[0]!r}: allowed{why}: {', '.join(known)}")
    return policies


def _check_shape(gpus: int, steps: int, split: int | None, staleness: int) -> None:
    """ValueError for a run shape `simulate` cannot run."""
    if gpus < 2:
        raise ValueError(f"gpus = {gpus}: must be >= 2 (one device per stage)")
    if steps < 1:
        raise ValueError(f"steps = {steps}: must be >= 1")
    if split is not None and not 1 <= split < gpus:
        raise ValueError(f"split = {split}: must be in 1..{gpus - 1} rollout devices")
    if not 0 <= staleness <= MAX_STALENESS:
        raise ValueError(f"staleness = {staleness}: allowed 0 (on-policy) .. {MAX_STALENESS}")


POLICY_COST = {"reference": 4.0, "hysteresis": 3.0, "fully-async": 3.0,
               "fully-async-keep-kv": 3.0, "borrow": 2.0,
               "static": 1.5, "colocated": 1.5, "oracle": 0.0}
"""Rough relative cost of a policy's run (which to start first when they run side by side)."""


class _PolicyTask:
    """One policy's final run (after the searches), as `simulate` runs it: a callable of the
    policy's name returning (its row, (wall s, CPU s) of the run)."""

    def __init__(self, wl: Workload, gpus: int, steps: int, staleness: int, seed: int,
                 costs: CostModel, out_dir: str | Path | None, faults: TwinFaults | None,
                 searches: dict[str, tuple[int, int]], split: int | None) -> None:
        self.wl, self.gpus, self.steps, self.staleness, self.seed = (
            wl, gpus, steps, staleness, seed)
        self.costs, self.out_dir, self.faults, self.searches = costs, out_dir, faults, searches
        self.split = split

    def __call__(self, policy: str) -> tuple[dict[str, Any], tuple[float, float]]:
        t0_s = (time.perf_counter(), time.process_time())
        row = self.row(policy)
        return row, (time.perf_counter() - t0_s[0], time.process_time() - t0_s[1])

    def row(self, policy: str) -> dict[str, Any]:
        wl, gpus, steps, staleness, seed, costs = (self.wl, self.gpus, self.steps,
                                                   self.staleness, self.seed, self.costs)
        out_dir, faults = _sub(self.out_dir, policy), self.faults
        if policy == "oracle":
            return oracle_result(oracle_steps(costs, wl, gpus, steps, staleness))
        if policy == "colocated":
            cfg = sim_config(wl, 1, gpus - 1, steps, 0, seed, costs)
            run = run_colocated(cfg, wl, costs, out_dir)
            row = results_row("colocated", run, {"rollout": gpus, "train": gpus})
            row["staleness"] = 0
            return row
        if policy.startswith("fully-async"):  # changes the semantics: a competitor's row
            keep = policy == "fully-async-keep-kv"
            fa = (self.split, 0) if self.split is not None else search_fully_async(
                wl, gpus, min(steps, FULLY_ASYNC_PROBE_STEPS), staleness, seed, costs, keep)
            row = run_fully_async(wl, gpus, fa[0], steps, staleness, seed, costs, keep)
            row.update(policy=policy, num_splits_tried=fa[1])
            return row
        if policy == "reference":
            ref = self.searches["fixed"]
            row = run_policy("fixed", wl, gpus, ref[0], steps, staleness, seed, costs,
                             out_dir, faults)
            row.update(policy="reference", num_splits_tried=ref[1])
            row.pop("split_is_initial", None)
            return row
        best = self.searches["static"]
        if policy == "static":
            row = run_static(wl, gpus, best[0], steps, staleness, seed, costs, out_dir, faults)
            row["num_splits_tried"] = best[1]
            return row
        return run_policy(policy, wl, gpus, best[0], steps, staleness, seed, costs, out_dir,
                          faults)


def _searches(prober: SplitProber, policies: tuple[str, ...],
              timings: dict[str, tuple[float, float]] | None) -> dict[str, tuple[int, int]]:
    """The split searches the `policies` need, from one prober: static's search is also the
    start of the controller policies; `timings` gets each search's (wall s, CPU s)."""
    searches: dict[str, tuple[int, int]] = {}
    t0_s = (time.perf_counter(), time.process_time())
    for name, policy in (("search", "static"), ("reference-search", "fixed")):
        wanted = policy == "fixed" and "reference" in policies or policy == "static" and any(
            p not in ("reference", *NOT_ORCHESTRATOR) for p in policies)
        if wanted:
            searches[policy] = prober.search(policy)
            t1_s = (time.perf_counter(), time.process_time())
            if timings is not None:
                timings[name] = (t1_s[0] - t0_s[0], t1_s[1] - t0_s[1])
            t0_s = t1_s
    return searches


def simulate(workload: str | Workload, gpus: int, policies: tuple[str, ...] | None = None,
             steps: int = 50, staleness: int = 1, seed: int = 0,
             cost_model: str | CostModel = "h100-7b", requests_per_step: int | None = None,
             out_dir: str | Path | None = None, split: int | None = None,
             timings: dict[str, tuple[float, float]] | None = None,
             faults: TwinFaults | None = None, workers: int | None = None,
             speculation: str | Speculation | None = None) -> dict[str, Any]:
    """Compare `policies` (default: `default_policies()`) on one workload; returns the JSON
    object of `dynaresize simulate --json`. `split` fixes the rollout-device count of
    `static` (and the start of controller policies) instead of searching it. `timings`, if
    given, receives (wall s, CPU s) of the twin's own cost per policy's run and for the split
    searches (`search`, `reference-search`; their CPU s is this process's only, without the
    probes' worker processes) (bench/sim_scaling.py). `workers`: processes for the probes and
    the policies' runs (default: the usable cores; one for runs of fewer than
    `probes.PARALLEL_MIN_REQUEST_STEPS` request-steps); the numbers do not depend on it.
    `speculation`: off (None), "das", a histogram file or a `Speculation`, for every policy
    alike. `faults`: see the module docstring. Raises ValueError for bad input
    (ConfigError, a ValueError, for a bad fault entry)."""
    policies = _checked_policies(policies, bool(faults))
    _check_shape(gpus, steps, split, staleness)
    wl = workload if isinstance(workload, Workload) else resolve_workload(
        workload, seed=seed, requests_per_step=requests_per_step)
    costs = cost_model if isinstance(cost_model, CostModel) else get_cost_model(cost_model)
    spec = speculation if isinstance(speculation, Speculation) or speculation is None \
        else resolve_speculation(speculation)
    if spec is not None:
        costs = replace(costs, speculation=spec)
    if wl.num_steps is not None and steps > wl.num_steps:
        raise ValueError(f"steps = {steps}: the trace {wl.name} has only {wl.num_steps}")
    if faults:  # the entries against this run's devices and steps, before anything runs
        sim_config(wl, split or 1, gpus - (split or 1), steps, staleness, seed, costs, faults)
    searches = {"static": (split, 0), "fixed": (split, 0)} if split is not None else _searches(
        SplitProber(wl, gpus, steps, staleness, seed, costs, workers), policies, timings)
    task = _PolicyTask(wl, gpus, steps, staleness, seed, costs, out_dir, faults, searches, split)
    order = sorted(policies, key=lambda p: -POLICY_COST.get(p, 1.0))  # the longest first
    cores = usable_cores() if workers is None else max(1, workers)
    big = wl.prompts_per_step * wl.samples_per_prompt * steps >= PARALLEL_MIN_REQUEST_STEPS
    done = dict(zip(order, fork_map(task, order, cores if big else 1), strict=True))
    results = [done[p][0] for p in policies]
    if timings is not None:
        timings.update((p, done[p][1]) for p in policies)
    out = {"workload": wl.name, "gpus": gpus, "steps": steps, "staleness": staleness,
           "cost_model": f"{costs.gpu.name}/{costs.model.name}", "results": results}
    if spec is not None:
        out["speculation"] = {"name": spec.name,
                              "mean_accepted": round(spec.mean_accepted, 3)}
    out.update(hysteresis_summary(results))
    return out


def hysteresis_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """`hysteresis_vs`: hysteresis's samples/s as a fraction of every other row's (the
    `oracle` bound and the `reference` users could configure among them); `churn`: its
    resizes and their critical-path seconds per step against the seconds per step it saves
    over the best fixed split (`reference`, else `static`). Empty without a hysteresis row."""
    rows = {r["policy"]: r for r in results}
    hyst = rows.get("hysteresis")
    if hyst is None:
        return {}
    out: dict[str, Any] = {"hysteresis_vs": {
        p: round(hyst["samples_per_s"] / r["samples_per_s"], 3)
        for p, r in rows.items() if p != "hysteresis" and r["samples_per_s"] > 0}}
    base = rows.get("reference") or rows.get("static")
    if "resize_s_per_step" in hyst:
        out["churn"] = {"resizes_per_step": hyst["resizes_per_step"],
                        "resize_s_per_step": hyst["resize_s_per_step"],
                        "saved_s_per_step": round(base["mean_step_s"] - hyst["mean_step_s"], 2)
                        if base else None,
                        "versus": base["policy"] if base else None}
    return out
