"""The twin's rollout engine with speculative decoding (`sim.speculation`): `SimEngine`'s
continuous batching where a verify iteration advances each request by its own tokens per
iteration at the engine's current budget.

Between two events the budget `p` is fixed (picked by `best_level` at the event: batch and
KV context), each running request advances `rate` tokens per iteration (`SpecTable`), the KV
context grows by the sum of the rates, and the span is `spec_span_s` in closed form. A change
of budget rebases every running request (tokens done so far, new rate) and rebuilds the
finish-iteration heap: O(batch) a few times per step, as the batch shrinks into the tail.
`SimEngine` itself is untouched: with speculation off the twin runs exactly as before.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.protocols import Clock
from dynaresize.sim.costs import CostModel
from dynaresize.sim.device_types import EngineRequest, Lengths, SimCompletion, SimInflight
from dynaresize.sim.engine_model import SimEngine
from dynaresize.sim.speculation import best_level, spec_iters_within, spec_span_s


class SpecRequest(EngineRequest):
    __slots__ = ("rate",)

    def __init__(self, spec: RequestSpec, prompt_tokens: int, target_tokens: int,
                 generated: float) -> None:
        super().__init__(spec, prompt_tokens, target_tokens, generated)  # type: ignore[arg-type]
        self.rate = 1.0
        """Tokens per iteration at the engine's current budget."""


def make_engine(index: int, costs: CostModel, lengths: Lengths,
                clock: Clock | None = None) -> SimEngine:
    """`MultiTurnEngine` for a workload of episodes (`sim.episodes`; it reads `clock`),
    `SpecEngine` when `costs.speculation` is set, else the plain `SimEngine`."""
    if getattr(lengths.workload, "episode_model", None) is not None:
        if getattr(costs, "speculation", None) is not None:
            raise ValueError("speculation is not modelled for multi-turn episodes "
                             "(--episodes / agentic-turns): leave --speculation off")
        from dynaresize.sim.engine_turns import MultiTurnEngine
        return MultiTurnEngine(index, costs, lengths, clock)
    if getattr(costs, "speculation", None) is None:
        return SimEngine(index, costs, lengths)
    return SpecEngine(index, costs, lengths)


class SpecEngine(SimEngine):
    def __init__(self, index: int, costs: CostModel, lengths: Lengths) -> None:
        super().__init__(index, costs, lengths)
        self.table = lengths.spec_table(costs.speculation)
        self._level = 1
        self._rate_sum = 0.0
        self._comp_per_request_s = costs.hot_terms[3]  # type: ignore[attr-defined]

    def submit(self, requests: list[RequestSpec | InflightRequest]) -> None:
        for work in requests:
            if isinstance(work, InflightRequest):
                spec = work.spec
                done = work.num_generated if isinstance(work, SimInflight) else len(
                    work.generated)
            else:
                spec, done = work, 0
            responses, prompts = self._lengths(spec.step)
            target = min(responses[spec.prompt][spec.sample], spec.max_new_tokens)
            self._waiting.append(SpecRequest(spec, prompts[spec.prompt], max(1, target),
                                             float(done)))

    def _rate(self, req: Any, p: int) -> float:
        if p == 1:
            return 1.0
        s = req.spec
        return self.table.rates(s.step, p)[s.prompt][s.sample]

    def _key(self, req: Any) -> int:
        left = (req.target_tokens - req.generated) / req.rate
        return req.start_iter + max(1, math.ceil(left - 1e-9))

    def _ctx(self, req: Any) -> float:  # type: ignore[override]
        return req.prompt_tokens + req.generated + (self._iter - req.start_iter) * req.rate

    def _admit(self) -> float:
        prefill_tokens = 0.0
        waiting, running = self._waiting, self._running
        limit, capacity = self.costs.max_running_requests, self.kv_capacity_tokens
        while waiting and len(running) < limit:
            req: Any = waiting[0]
            ctx = req.prompt_tokens + req.generated
            rate = self._rate(req, self._level)
            # room for the prefill and one verify iteration of every running request at the
            # current budget (tokens per iteration, not 1), else the next span preempts it
            # straight away and it is readmitted: a livelock without virtual time passing
            if ctx + rate > capacity - self._kv_tokens - self._rate_sum - 1 and running:
                break
            waiting.popleft()
            req.start_iter, req.live = self._iter, True
            req.rate = rate
            self._rate_sum += req.rate
            running[req] = None
            self._kv_tokens += ctx
            prefill_tokens += ctx
            heapq.heappush(self._finish_heap, (self._key(req), next(self._seq), req))
        return self.costs.prefill_s(int(prefill_tokens)) if prefill_tokens else 0.0

    def _preempt_youngest(self) -> None:
        req: Any = next(reversed(self._running))
        del self._running[req]
        self._kv_tokens -= self._ctx(req)
        req.generated += (self._iter - req.start_iter) * req.rate
        self._rate_sum -= req.rate
        req.live = False
        self._waiting.appendleft(req)

    def _switch(self, p: int) -> None:
        """Rebase every running request onto budget `p` (module doc)."""
        it, heap, rate_sum = self._iter, [], 0.0
        for req in self._running:
            r: Any = req
            r.generated += (it - r.start_iter) * r.rate
            r.start_iter, r.rate = it, self._rate(r, p)
            rate_sum += r.rate
            heap.append((self._key(r), next(self._seq), r))
        heapq.heapify(heap)
        self._finish_heap, self._rate_sum, self._level = heap, rate_sum, p

    def _span(self, max_s: float, elapsed_s: float) -> tuple[int, float, int] | None:
        """The next span: (iterations, seconds, budget); None after a preemption."""
        costs, running = self.costs, self._running
        bw, kv, w, _ = costs.hot_terms  # type: ignore[attr-defined]
        batch = len(running)
        p = best_level(costs.speculation, self._comp_per_request_s, batch,
                       (w + self._kv_tokens * kv) / bw, costs.iteration_overhead_s)
        if p != self._level:
            self._switch(p)
        heap = self._finish_heap
        while not heap[0][2].live:
            heapq.heappop(heap)
        kv_room = math.floor((self.kv_capacity_tokens - self._kv_tokens) / self._rate_sum)
        if kv_room <= 0:
            if batch == 1:
                req = next(iter(running))
                raise ValueError(  # bad input (workload x cost model): exit 2
                    f"simulated device {self.index}: request (step {req.spec.step}, prompt "
                    f"{req.spec.prompt}, sample {req.spec.sample}) needs more than the "
                    f"{self.kv_capacity_tokens} KV-cache tokens one device holds under this "
                    "cost model; use a larger GPU or shorter lengths")
            self._preempt_youngest()
            return None
        n = min(heap[0][0] - self._iter, kv_room)
        comp_s = self._comp_per_request_s * batch * p
        span_s = spec_span_s(costs, n, comp_s, self._rate_sum, self._kv_tokens)
        if elapsed_s + span_s > max_s:
            n = max(1, spec_iters_within(costs, max_s - elapsed_s, comp_s, self._rate_sum,
                                         self._kv_tokens))
            span_s = spec_span_s(costs, n, comp_s, self._rate_sum, self._kv_tokens)
        return n, span_s, p

    def run(self, max_s: float, until_empty: bool, version: int
            ) -> tuple[list[Completion], float]:
        elapsed_s = 0.0
        done: list[Completion] = []
        table, heap_pop = self.table, heapq.heappop
        while until_empty or not done:
            if self._waiting:
                elapsed_s += self._admit()
            if not self._running or elapsed_s >= max_s:
                break
            got = self._span(max_s, elapsed_s)
            if got is None:
                continue
            n, span_s, p = got
            batch = len(self._running)
            elapsed_s += span_s
            self._iter += n
            self._kv_tokens += n * self._rate_sum
            if p > 1:
                table.spec_tokens += n * self._rate_sum
                table.spec_request_iters += n * batch
            else:
                table.plain_request_iters += n * batch
            heap = self._finish_heap
            while heap and heap[0][0] <= self._iter:
                req: Any = heap_pop(heap)[2]
                if req.live:
                    del self._running[req]
                    req.live = False
                    self._kv_tokens = max(0.0, self._kv_tokens - self._ctx(req))
                    self._rate_sum -= req.rate
                    length, spec = req.target_tokens, req.spec
                    done.append(SimCompletion(
                        spec, [length], [], "length" if length >= spec.max_new_tokens else "eos",
                        self.index, version, length))
            if not self._running:
                self._rate_sum, self._kv_tokens = 0.0, 0.0
            if elapsed_s >= max_s:
                break
        return done, elapsed_s

    def export(self) -> list[InflightRequest]:
        out: list[InflightRequest] = []
        for req in list(self._running):
            r: Any = req
            r.generated += (self._iter - r.start_iter) * r.rate
            out.append(SimInflight(r.spec, num_generated=int(r.generated)))
        out += [SimInflight(r.spec, num_generated=int(r.generated)) for r in self._waiting]
        self._running.clear()
        self._waiting.clear()
        self._finish_heap.clear()
        self._kv_tokens, self._rate_sum = 0, 0.0
        return out
