"""SimDevice: the `Device` protocol in virtual time, charged by a `CostModel`.

Rollout engine model (continuous batching, event-driven): requests wait in a FIFO queue and
are admitted while the engine has a free slot (`max_running_requests`) and KV room for their
context. Between two events the running batch `b` is fixed and the engine runs decode
iterations, each adding one token to every running request, timed in closed form by
`CostModel.decode_span_s`. Events: the next completion (a heap keyed by the iteration at which
each request finishes), the KV cache filling up (the youngest request is preempted back to the
queue head and re-prefilled later, as vLLM's recompute preemption does), or `max_s`. So one
`run_rollout` costs O(log b) per event, and a step O(requests log b), whatever the lengths.

Response lengths come from the `Workload`, looked up by (step, prompt, sample), capped by the
request's `max_new_tokens`. Completions carry a one-token stand-in (`[num_tokens]`) instead of
the response; `SimCompletion.num_tokens` is the true length. Training time comes from the true
lengths too (looked up by the samples' keys), so stand-ins never distort the model.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from dynaresize.protocols import Clock, WeightHandle
from dynaresize.sim.clock import VirtualClock
from dynaresize.sim.costs import CostModel
from dynaresize.sim.workloads import Workload
from dynaresize.types import Completion, InflightRequest, RequestSpec, Role, TrainSample


@dataclass
class SimCompletion(Completion):
    """A finished simulated response: `tokens` is a stand-in, `response_tokens` the length."""

    response_tokens: int = 0

    @property
    def num_tokens(self) -> int:  # type: ignore[override]
        return self.response_tokens

    @property
    def num_prompt_tokens(self) -> int:  # type: ignore[override]
        return self.spec.prompt_tokens[0]  # the twin's stand-in prompt is (its length,)


@dataclass
class SimInflight(InflightRequest):
    """An exported simulated request: `num_generated` tokens done, no token list."""

    num_generated: int = 0


class _Req:
    __slots__ = ("spec", "prompt_tokens", "target_tokens", "generated", "start_iter", "live")

    def __init__(self, spec: RequestSpec, prompt_tokens: int, target_tokens: int,
                 generated: int) -> None:
        self.spec = spec
        self.prompt_tokens = prompt_tokens
        self.target_tokens = target_tokens
        self.generated = generated
        """Tokens generated before `start_iter` (prefix of a migrated or preempted request)."""
        self.start_iter = 0
        self.live = False


_MEMBERS: dict[int, tuple[Any, tuple[int, ...], frozenset[int]]] = {}


def _members(members: Any) -> tuple[tuple[int, ...], frozenset[int]]:
    """(sorted members, member set) of a member collection, computed once per object: a
    resize hands every device the same tuple, so N devices cost O(N), not O(N^2). Only
    tuples are cached (immutable)."""
    if type(members) is not tuple:
        return tuple(sorted(members)), frozenset(members)
    got = _MEMBERS.get(id(members))
    if got is None or got[0] is not members:
        if len(_MEMBERS) >= 64:
            _MEMBERS.clear()
        got = _MEMBERS[id(members)] = (members, tuple(sorted(members)), frozenset(members))
    return got[1], got[2]


_PLANS: dict[tuple[int, int, int, int], tuple[Any, Any, CostModel,
                                               tuple[float, dict[int, float]]]] = {}
"""Reshard plans by (cost model, old members, new members, staging) object identity."""


class Lengths:
    """A workload's lengths per step as Python lists (a list lookup costs a tenth of indexing
    a numpy array), for the last few steps; one table is shared by a run's devices."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._steps: dict[int, tuple[list[list[int]], list[int]]] = {}

    def __call__(self, step: int) -> tuple[list[list[int]], list[int]]:
        """(response tokens [prompt][sample], prompt tokens [prompt]) of `step`."""
        got = self._steps.get(step)
        if got is None:
            if len(self._steps) >= 4:
                self._steps.clear()
            req = self.workload.step_requests(step)
            got = self._steps[step] = (req.response_tokens.tolist(), req.prompt_tokens.tolist())
        return got


class SimDevice:
    """One simulated GPU. Consumes requests / train samples; produces modelled time."""

    def __init__(self, index: int, costs: CostModel, workload: Workload, clock: Clock,
                 role: Role = Role.IDLE, lengths: Lengths | None = None) -> None:
        self.index = index
        self.role = role
        self.costs = costs
        self.workload = workload
        self._lengths = lengths if lengths is not None else Lengths(workload)
        self.clock = clock
        self._wait = clock.after if isinstance(clock, VirtualClock) else clock.sleep
        """`clock.sleep` (VirtualClock: its frame-less `after`)."""
        self.version = 0
        self.kv_capacity_tokens = costs.kv_capacity_tokens()
        self._waiting: deque[_Req] = deque()
        self._running: dict[_Req, None] = {}
        """Running requests in admission order (a dict: O(1) removal, youngest last)."""
        self._finish_heap: list[tuple[int, int, _Req]] = []
        self._seq = itertools.count()
        self._iter = 0
        self._kv_tokens = 0
        self._groups: set[frozenset[int]] = set()
        """Member sets this device has a communicator for (frozensets cache their hash)."""
        self._members: tuple[int, ...] = ()
        self._next_members: tuple[int, ...] = ()
        self.busy_s = 0.0
        """Virtual seconds this device spent charged with work (for utilisation checks)."""

    async def _spend(self, seconds: float) -> None:
        self.busy_s += seconds
        await self._wait(seconds)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    # ------------------------------------------------------------------ rollout role
    async def load_weights(self, version: int, weights: WeightHandle) -> None:
        await self._spend(self.costs.weight_sync_s())
        self.version = version
        self.role = Role.ROLLOUT

    async def submit(self, requests: list[RequestSpec | InflightRequest]) -> None:
        waiting = self._waiting
        step, responses, prompts = -1, [], []
        for work in requests:
            if isinstance(work, InflightRequest):
                spec = work.spec
                done = work.num_generated if isinstance(work, SimInflight) else len(
                    work.generated)
            else:
                spec, done = work, 0
            if spec.step != step:
                step = spec.step
                responses, prompts = self._lengths(step)
            target = responses[spec.prompt][spec.sample]
            if target > spec.max_new_tokens:
                target = spec.max_new_tokens
            waiting.append(_Req(spec, prompts[spec.prompt], target if target > 1 else 1, done))

    def _ctx(self, req: _Req) -> int:
        return req.prompt_tokens + req.generated + (self._iter - req.start_iter)

    def _admit(self) -> float:
        """Admit queued requests that fit; return the prefill seconds charged."""
        prefill_tokens = 0
        waiting, running, heap, seq = self._waiting, self._running, self._finish_heap, self._seq
        limit, capacity, it = self.costs.max_running_requests, self.kv_capacity_tokens, self._iter
        kv_tokens = self._kv_tokens
        while waiting and len(running) < limit:
            req = waiting[0]
            ctx = req.prompt_tokens + req.generated
            # room for the prefill and one decode iteration of every running request (else the
            # next iteration preempts it straight away, and run_rollout would spin)
            if ctx + 1 > capacity - kv_tokens - len(running) - 1 and running:
                break
            waiting.popleft()
            req.start_iter, req.live = it, True
            running[req] = None
            kv_tokens += ctx
            prefill_tokens += ctx
            heapq.heappush(heap, (it + req.target_tokens - req.generated, next(seq), req))
        self._kv_tokens = kv_tokens
        return self.costs.prefill_s(prefill_tokens) if prefill_tokens else 0.0

    def _preempt_youngest(self) -> None:
        req = next(reversed(self._running))
        del self._running[req]
        self._kv_tokens -= self._ctx(req)
        req.generated += self._iter - req.start_iter
        req.live = False
        self._waiting.appendleft(req)

    async def run_rollout(self, max_s: float, until_empty: bool = False) -> list[Completion]:
        # the simulator's hot loop: attributes in locals, `_complete` inlined
        elapsed_s = 0.0
        done: list[Completion] = []
        heap, running, waiting = self._finish_heap, self._running, self._waiting
        costs = self.costs
        span, span_terms = costs._span_scalar_s, costs.span_terms
        bw, kv, w, _ = costs._hot  # type: ignore[attr-defined]
        overhead_s = costs.iteration_overhead_s
        capacity = self.kv_capacity_tokens
        heappop, ceil = heapq.heappop, math.ceil
        index, version = self.index, self.version
        while until_empty or not done:
            if waiting:
                elapsed_s += self._admit()
            if not running or elapsed_s >= max_s:
                break
            while not heap[0][2].live:
                heappop(heap)
            batch = len(running)
            kv_tokens = self._kv_tokens
            kv_room = (capacity - kv_tokens) // batch
            if kv_room <= 0:
                if batch == 1:  # alone and still no room: it would be preempted forever
                    req = next(iter(running))
                    raise ValueError(  # bad input (workload x cost model): exit 2
                        f"simulated device {index}: request (step {req.spec.step}, prompt "
                        f"{req.spec.prompt}, sample {req.spec.sample}) needs more than the "
                        f"{capacity} KV-cache tokens one device holds under this cost model "
                        f"({kv_tokens} in use); use a larger GPU or shorter lengths")
                self._preempt_youngest()
                continue
            n = heap[0][0] - self._iter
            if kv_room < n:
                n = kv_room
            # `costs._span_scalar_s(n, batch, kv_tokens)` inlined (n >= 1), same arithmetic
            comp_s, cross = span_terms(batch)
            first_mem = ceil((cross - kv_tokens) / batch)
            first_mem = 0 if first_mem < 0 else (n if first_mem > n else first_mem)
            m = n - first_mem
            span_s = n * overhead_s + first_mem * comp_s + (
                m * (w + kv_tokens * kv) + batch * kv * (first_mem + n - 1) * m / 2.0) / bw
            if elapsed_s + span_s > max_s:
                n = max(1, self.costs.decode_iters_within(max_s - elapsed_s, batch, kv_tokens))
                span_s = span(n, batch, kv_tokens)
            elapsed_s += span_s
            it = self._iter = self._iter + n
            kv_tokens += n * batch
            while heap and heap[0][0] <= it:
                req = heappop(heap)[2]
                if req.live:  # complete it
                    spec = req.spec
                    del running[req]
                    req.live = False
                    kv_tokens -= req.prompt_tokens + req.generated + (it - req.start_iter)
                    length = req.target_tokens
                    done.append(SimCompletion(  # positional: response_tokens last
                        spec, [length], [], "length" if length >= spec.max_new_tokens else "eos",
                        index, version, length))
            self._kv_tokens = kv_tokens
            if elapsed_s >= max_s:
                break
        self.busy_s += elapsed_s
        await self._wait(elapsed_s)
        return done

    async def export_inflight(self) -> list[InflightRequest]:
        out: list[InflightRequest] = []
        for req in list(self._running):
            req.generated += self._iter - req.start_iter
            out.append(SimInflight(req.spec, num_generated=req.generated))
        out += [SimInflight(r.spec, num_generated=r.generated) for r in self._waiting]
        self._running.clear()
        self._waiting.clear()
        self._finish_heap.clear()
        self._kv_tokens = 0
        await self._spend(len(out) * self.costs.resize.export_per_request_s)
        return out

    # ------------------------------------------------------------------ resize ops (DESIGN §4)
    async def release_kv(self) -> None:
        """Free the KV cache of an empty engine: `release_kv_s`."""
        assert not self._running and not self._waiting, "release_kv on a busy engine"
        self.role = Role.IDLE
        await self._spend(self.costs.resize.release_kv_s)

    async def release_rollout_weights(self) -> None:
        """Drop the engine's weights (deferrable): `release_weights_s`."""
        await self._spend(self.costs.resize.release_weights_s)

    async def alloc_kv(self) -> None:
        """Allocate the KV cache and warm the engine up: `alloc_kv_s + start_serving_s`."""
        await self._spend(self.costs.resize.alloc_kv_s + self.costs.resize.start_serving_s)
        self.role = Role.ROLLOUT

    async def join_group(self, members: tuple[int, ...]) -> bool:
        """Communicator cache keyed by the member set: `join_group_first_s` the first time
        this device sees `members`, `join_group_cached_s` after. True if created."""
        member_set = _members(members)[1]
        created = member_set not in self._groups
        self._groups.add(member_set)
        r = self.costs.resize
        await self._spend(r.join_group_first_s if created else r.join_group_cached_s)
        return created

    async def reshard(self, old_members: tuple[int, ...], new_members: tuple[int, ...],
                      generation: int, optimizer_step: int, staging_bytes: int
                      ) -> dict[str, float]:
        """The whole collective's time under the bounded-staging model
        (`CostModel.reshard_plan_s`): every member waits for the busiest one. Returns this
        device's `bytes_sent`."""
        key = (id(self.costs), id(old_members), id(new_members), staging_bytes)
        got = _PLANS.get(key)
        if got is None or got[0] is not old_members or got[1] is not new_members \
                or got[2] is not self.costs or type(old_members) is not tuple \
                or type(new_members) is not tuple:
            if len(_PLANS) >= 64:
                _PLANS.clear()
            got = _PLANS[key] = (old_members, new_members, self.costs, self.costs.reshard_plan_s(
                tuple(old_members), tuple(new_members), staging_bytes))
        wall_s, sent = got[3]  # the same plan for every member: computed once per resize
        key, member_set = _members(new_members)
        self._next_members = key if self.index in member_set else ()
        await self._spend(wall_s)
        return {"bytes_sent": float(sent.get(self.index, 0.0))}

    async def commit_train_group(self, new_members: tuple[int, ...]) -> None:
        """Switch to the prepared group (members) or stop training (others): `commit_s`."""
        key, member_set = _members(new_members)
        if self.index in member_set:
            self._members, self.role = key, Role.TRAIN
        else:
            self._members = ()
        self._next_members = ()
        await self._spend(self.costs.resize.commit_s)

    async def abort_reshard(self) -> None:
        """Discard the prepared layout; the old one stays in charge (free)."""
        self._next_members = ()

    async def drop_trainer(self) -> None:
        """Free a former trainer's state (deferrable): `release_weights_s`."""
        await self._spend(self.costs.resize.release_weights_s)

    # ------------------------------------------------------------------ train role
    async def join_train_group(self, members: tuple[int, ...], generation: int) -> None:
        key, member_set = _members(members)
        if self.index not in member_set:
            if self.role == Role.TRAIN:
                self.role = Role.IDLE
            return
        r = self.costs.resize
        cost_s = r.join_group_cached_s if member_set in self._groups else r.join_group_first_s
        self._groups.add(member_set)
        self._members = key
        self.role = Role.TRAIN
        await self._spend(cost_s)

    def _sample_tokens(self, s: TrainSample) -> int:
        responses, prompts = self._lengths(s.step)
        return prompts[s.prompt] + responses[s.prompt][s.sample]

    def train_step_s(self, micro_batches: list[list[TrainSample] | None]) -> tuple[float, int]:
        """(seconds, tokens) `train_step` charges for these micro-batches."""
        num_tokens = sum(self._sample_tokens(s) for mb in micro_batches if mb for s in mb)
        num_ranks = max(1, len(self._members))
        return self.costs.train_step_overhead_s + num_tokens * self.costs.train_token_s() \
            / self.costs.dp_efficiency(num_ranks), num_tokens

    async def train_step(self, step: int, micro_batches: list[list[TrainSample] | None],
                         global_num_tokens: int) -> dict[str, float]:
        seconds, num_tokens = self.train_step_s(micro_batches)
        await self._spend(seconds)
        return {"loss": 0.0, "num_tokens": float(num_tokens)}

    async def train_accumulate(self, step: int,
                               micro_batches: list[tuple[int, list[TrainSample]]]) -> None:
        num_tokens = sum(self._sample_tokens(s) for _, mb in micro_batches for s in mb)
        num_ranks = max(1, len(self._members))
        await self._spend(num_tokens * self.costs.train_token_s()
                          / self.costs.dp_efficiency(num_ranks))

    async def train_finish(self, step: int, num_micro_batches: int,
                           global_num_tokens: int) -> dict[str, float]:
        await self._spend(self.costs.train_step_overhead_s)
        return {"loss": 0.0}

    async def publish_weights(self, version: int) -> WeightHandle | None:
        await self._spend(self.costs.weight_sync_latency_s)
        self.version = version
        first = not self._members or self.index == self._members[0]  # sorted
        return version if first else None

    async def param_checksum(self) -> tuple[float, str]:
        return 0.0, "sim"


def make_devices(num_devices: int, num_rollout: int, costs: CostModel, workload: Workload,
                 clock: Clock) -> list[Any]:
    """Devices 0..R-1 start as rollout, the rest as training (DESIGN §5)."""
    lengths = Lengths(workload)
    return [SimDevice(i, costs, workload, clock, Role.ROLLOUT if i < num_rollout else Role.TRAIN,
                      lengths) for i in range(num_devices)]
