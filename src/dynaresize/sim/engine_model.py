"""The rollout engine of a `SimDevice`: continuous batching in closed form (see `sim.device`).

Consumes requests (`submit`); `run` advances decode iterations event by event and returns the
completions with the modelled seconds they took; the device charges that time. No clock here.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.sim.costs import CostModel
from dynaresize.sim.device_types import EngineRequest, Lengths, SimCompletion, SimInflight


class SimEngine:
    """One device's engine state: a FIFO queue, the running batch, a finish-iteration heap."""

    def __init__(self, index: int, costs: CostModel, lengths: Lengths) -> None:
        self.index = index
        self.costs = costs
        self._lengths = lengths
        self.kv_capacity_tokens = costs.kv_capacity_tokens()
        self._waiting: deque[EngineRequest] = deque()
        self._running: dict[EngineRequest, None] = {}
        """Running requests in admission order (a dict: O(1) removal, youngest last)."""
        self._finish_heap: list[tuple[int, int, EngineRequest]] = []
        self._seq = itertools.count()
        self._iter = 0
        self._kv_tokens = 0

    @property
    def is_empty(self) -> bool:
        return not self._running and not self._waiting

    def submit(self, requests: list[RequestSpec | InflightRequest]) -> None:
        """Queue requests (new, or migrated with their generated prefix)."""
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
            waiting.append(EngineRequest(spec, prompts[spec.prompt], target if target > 1 else 1,
                                         done))

    def _ctx(self, req: EngineRequest) -> int:
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

    def run(self, max_s: float, until_empty: bool, version: int
            ) -> tuple[list[Completion], float]:
        """Decode until a request finishes (`until_empty`: until none is left), `max_s`
        passes or the engine is empty: (completions, modelled seconds). Completions carry
        `version`. The simulator's hot loop: attributes in locals, `_complete` inlined."""
        elapsed_s = 0.0
        done: list[Completion] = []
        heap, running, waiting = self._finish_heap, self._running, self._waiting
        costs = self.costs
        span, span_terms = costs.span_scalar_s, costs.span_terms
        bw, kv, w, _ = costs.hot_terms  # type: ignore[attr-defined]
        overhead_s = costs.iteration_overhead_s
        capacity = self.kv_capacity_tokens
        heappop, ceil = heapq.heappop, math.ceil
        index = self.index
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
            # `costs.span_scalar_s(n, batch, kv_tokens)` inlined (n >= 1), same arithmetic
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
        return done, elapsed_s

    def kv_held_tokens(self) -> int:
        """Context tokens whose KV the engine holds now (its running requests')."""
        return int(self._kv_tokens)

    def export(self) -> list[InflightRequest]:
        """Remove every queued and running request, with the tokens generated so far."""
        out: list[InflightRequest] = []
        for req in list(self._running):
            req.generated += self._iter - req.start_iter
            out.append(SimInflight(req.spec, num_generated=req.generated))
        out += [SimInflight(r.spec, num_generated=r.generated) for r in self._waiting]
        self._running.clear()
        self._waiting.clear()
        self._finish_heap.clear()
        self._kv_tokens = 0
        return out
