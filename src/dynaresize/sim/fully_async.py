"""The `fully-async` reference (issue 25): what verl's fully-async mode and AReaL users run.
**It changes the RL semantics** (it is a competitor's configuration, not ours): rollouts are
partial (a request in flight when a new version is published goes on under the new weights,
so one sample may mix policy versions) and the trainer takes groups in the order they
complete, so a step's batch is not a fixed set of prompts (short responses are trained first).

Model, per run on N = R + T devices at a fixed split (R rollout engines, T trainers), in
virtual time, with the twin's engines (`make_engine`: the same cost model and speculation):

- requests are issued in step order, each to the rollout engine with the fewest in flight (at
  most `max_running_requests` each); a request of step t is admitted once version t - k is
  published (AReaL's bound on staleness: at most k versions between a sample's first token
  and the trainer's version when the trainer takes it: k + 1 batches in flight at most);
- an engine runs until its next completion (at most `SLICE_S` at a time); when a version is
  published, each engine loads it at its next event (`weight_sync_s`, partial rollouts: its
  requests keep their tokens and go on), up to one completion span late;
- at that load the engine's KV cache is dropped and every request it holds is queued again
  with its tokens so far, so each re-prefills its whole context (prompt and response so far)
  under the new weights when it is admitted again. That is what the competitors do: AReaL's
  vLLM server aborts every running and waiting request and resets the prefix cache before a
  weight update (`areal/thirdparty/vllm/areal_vllm_server.py`, "to prevent kv cache
  pollution"), and its client resubmits each with `input_ids += output_tokens`
  (`areal/core/remote_inf_engine.py`, `agenerate`); slime's fully-async example re-queues the
  interrupted groups ("KV cache is recomputed on resume"). KV computed under the old weights
  is not that of the new ones, so keeping it would change the tokens further still.
  `keep_kv=True` (policy `fully-async-keep-kv`) keeps it instead: an upper bound on the
  competitor, not a configuration it runs;
- training step j starts when step j - 1's update is published and `prompts_per_step` groups
  (all samples of a prompt) have completed and not yet been trained, in completion order;
  it takes `train_step_s(tokens, T)` plus the publish latency.

`run_fully_async` returns a `simulate` results row: samples/s over the run (from the start to
the last publish), `mixed_version_share` (samples whose generation spanned a weight update),
`max_lag` (most versions between a trained sample's first token and the trainer's version),
`reprefill_tokens` (tokens prefilled again after weight updates) and `kv_on_update`.
The best split is searched (`search_fully_async`) on a grid like `static`'s.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from dynaresize.core.types import RequestSpec
from dynaresize.sim.costs import CostModel
from dynaresize.sim.device_types import Lengths
from dynaresize.sim.engine_spec import make_engine
from dynaresize.sim.workloads import Workload

SLICE_S = 5.0
"""Longest engine span between two looks at the trainer (virtual seconds)."""


class _Trainer:
    """Groups completed but not trained, the training steps done, the published version."""

    def __init__(self, workload: Workload, costs: CostModel, num_train: int) -> None:
        self.wl, self.costs, self.num_train = workload, costs, num_train
        self.ready: list[tuple[int, int, int]] = []
        """(step, prompt, first version) of completed groups, in completion order."""
        self.version = 0
        self.busy_until: float | None = None
        self.publish_s: list[float] = []
        self.max_lag = 0

    def maybe_start(self, now_s: float) -> None:
        b = self.wl.prompts_per_step
        if self.busy_until is not None or len(self.ready) < b:
            return
        batch, self.ready = self.ready[:b], self.ready[b:]
        tokens = 0
        for step, prompt, first_version in batch:
            req = self.wl.step_requests(step)
            tokens += int(req.response_tokens[prompt].sum()) \
                + self.wl.samples_per_prompt * int(req.prompt_tokens[prompt])
            self.max_lag = max(self.max_lag, self.version - first_version)
        self.busy_until = now_s + self.costs.train_step_s(tokens, self.num_train) \
            + self.costs.weight_sync_latency_s


def run_fully_async(workload: Workload, gpus: int, num_rollout: int, steps: int,
                    staleness: int, seed: int, costs: CostModel, keep_kv: bool = False
                    ) -> dict[str, Any]:
    """One fully-async run at `num_rollout` engines (module doc); its results row.
    `keep_kv`: requests keep their KV across a weight update (else they re-prefill it)."""
    lengths = Lengths(workload)
    engines = [make_engine(i, costs, lengths) for i in range(num_rollout)]
    trainer = _Trainer(workload, costs, gpus - num_rollout)
    in_flight = [0] * num_rollout
    engine_version = [0] * num_rollout
    first_version: dict[tuple[int, int, int], int] = {}
    group_left: dict[tuple[int, int], int] = {}
    group_first: dict[tuple[int, int], int] = {}
    mixed = [0, 0]
    reprefill_tokens = 0
    issue = _Issuer(workload, staleness, steps)
    clock: list[tuple[float, int]] = [(0.0, e) for e in range(num_rollout)]
    sync_s = costs.weight_sync_s()
    limit = costs.max_running_requests
    idle: list[int] = []
    while len(trainer.publish_s) < steps:
        next_s = clock[0][0] if clock else float("inf")
        if trainer.busy_until is not None and trainer.busy_until <= next_s:
            done_at, trainer.busy_until = trainer.busy_until, None
            trainer.version += 1
            trainer.publish_s.append(done_at)
            trainer.maybe_start(done_at)
            for i in idle:  # a new version: more requests may be admitted
                heapq.heappush(clock, (done_at, i))
            idle.clear()
            continue
        if not clock:
            raise RuntimeError("fully-async: nothing to run and nothing to train")
        now_s, e = heapq.heappop(clock)
        if engine_version[e] < trainer.version:
            engine_version[e] = trainer.version
            if not keep_kv:
                reprefill_tokens += _drop_kv(engines[e])
            heapq.heappush(clock, (now_s + sync_s, e))
            continue
        new = issue.take(trainer.version, limit - in_flight[e])
        for spec in new:
            first_version[(spec.step, spec.prompt, spec.sample)] = trainer.version
        if new:
            engines[e].submit(new)
            in_flight[e] += len(new)
        if not in_flight[e]:  # idle until the trainer publishes
            idle.append(e)
            continue
        max_s = SLICE_S if trainer.busy_until is None else max(1e-6, min(
            SLICE_S, trainer.busy_until - now_s))
        done, elapsed_s = engines[e].run(max_s, False, engine_version[e])
        t_s = now_s + elapsed_s
        for c in done:
            s = c.spec
            in_flight[e] -= 1
            v0 = first_version.pop((s.step, s.prompt, s.sample))
            mixed[0] += v0 != engine_version[e]
            mixed[1] += 1
            key = (s.step, s.prompt)
            group_first[key] = min(group_first.get(key, v0), v0)
            group_left[key] = group_left.get(key, workload.samples_per_prompt) - 1
            if not group_left[key]:
                trainer.ready.append((s.step, s.prompt, group_first.pop(key)))
                del group_left[key]
        trainer.maybe_start(t_s)
        heapq.heappush(clock, (t_s, e))
    row = _row(workload, gpus, num_rollout, steps, staleness, trainer, mixed,
               getattr(engines[0], "table", None))
    row.update(kv_on_update="keep" if keep_kv else "recompute", reprefill_tokens=reprefill_tokens)
    return row


def _drop_kv(engine: Any) -> int:
    """Queue every request of `engine` again with its tokens so far (its KV dropped: each
    re-prefills its context when admitted); the context tokens whose KV was dropped."""
    held_tokens = engine.kv_held_tokens()
    engine.submit(engine.export())
    return held_tokens


def _row(workload: Workload, gpus: int, num_rollout: int, steps: int, staleness: int,
         trainer: _Trainer, mixed: list[int], stats: Any) -> dict[str, Any]:
    """The results row of a finished run (module doc)."""
    total_s = trainer.publish_s[-1]
    step_s = np.diff([0.0, *trainer.publish_s])
    num_samples = steps * workload.prompts_per_step * workload.samples_per_prompt
    row: dict[str, Any] = {
        "policy": "fully-async", "split": {"rollout": num_rollout, "train": gpus - num_rollout},
        "mean_step_s": round(float(step_s.mean()), 4),
        "p99_step_s": round(float(np.percentile(step_s, 99)), 4),
        "samples_per_s": round(num_samples / total_s, 4),
        "tokens_per_s": None, "bubble_fraction": None, "num_resizes": 0,
        "staleness": staleness, "semantics": "changed: partial rollouts mix versions; groups "
        "trained in completion order",
        "mixed_version_share": round(mixed[0] / max(1, mixed[1]), 4),
        "max_lag": trainer.max_lag}
    if stats is not None:
        got = stats.stats()
        row["accepted_per_iteration"] = got["accepted_per_iteration"]
        row["speculating_share"] = got["speculating_share"]
    return row


class _Issuer:
    """Requests in step order; step t's only once version t - k is published."""

    def __init__(self, workload: Workload, staleness: int, steps: int) -> None:
        self.wl, self.k = workload, staleness
        self.step, self.index = 0, 0
        self.max_step = steps + staleness + 1
        self.per_step = workload.prompts_per_step * workload.samples_per_prompt

    def left(self, version: int) -> bool:
        return self.step < self.max_step and self.step - self.k <= version

    def take(self, version: int, room: int) -> list[RequestSpec]:
        out: list[RequestSpec] = []
        wl = self.wl
        while room > 0 and self.left(version):
            prompt, sample = divmod(self.index, wl.samples_per_prompt)
            out.append(RequestSpec(step=self.step, prompt=prompt, sample=sample, version=version,
                                   prompt_tokens=(1,), max_new_tokens=wl.max_response_tokens,
                                   seed=0))
            room -= 1
            self.index += 1
            if self.index == self.per_step:
                self.step, self.index = self.step + 1, 0
        return out


def search_fully_async(workload: Workload, gpus: int, steps: int, staleness: int, seed: int,
                       costs: CostModel, keep_kv: bool = False) -> tuple[int, int]:
    """The best split for fully-async: every N/8-th split, then halving steps around the
    best down to max(1, N/64) (each split simulated once). (best R, splits simulated)."""
    scores: dict[int, float] = {}

    def score(r: int) -> float:
        if r not in scores:
            scores[r] = -run_fully_async(workload, gpus, r, steps, staleness, seed,
                                         costs, keep_kv)["samples_per_s"]
        return scores[r]

    h = max(1, gpus // 8)
    best = min(range(h, gpus, h), key=score)
    floor = max(1, gpus // 64)
    while h > floor:
        h = max(floor, h // 2)
        for r in (best - h, best + h):
            if 1 <= r < gpus and score(r) < score(best):
                best = r
    return best, len(scores)
