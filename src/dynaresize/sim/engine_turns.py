"""The twin's engine for multi-turn episodes (`sim.episodes`): a turn is a request.

`MultiTurnEngine` is `SimEngine`'s continuous batching where a request is one turn of an
episode. When a turn's last token is decoded the episode leaves the batch (its KV is freed)
and waits for its tool OFF the engine: it is parked until `tool_s` seconds of virtual time
have passed, while the engine serves other requests. Then its next turn joins the queue with
the context grown by that turn's model tokens and the tool's observation tokens. The prefill of
a new turn is the whole context (`EpisodeModel.keep_kv = False`: the builtin `RolloutEngine`
keeps no cache between requests, envs.serve) or only the observation (`keep_kv = True`: a
prefix-cache hit, as vLLM's automatic prefix caching gives; a preempted or migrated turn
recomputes its whole context either way).

A completion is the episode's (one per episode: samples come out exactly once), with the
trajectory length as `response_tokens`. Time: the engine reads the device's clock at every
`run` (tools progress in virtual time between calls too); with no clock, its own seconds. If
only parked episodes are left, `run` waits for the next tool (the seconds count as
`tool_idle_s`: rollout time in which the engine had nothing to decode). `export` hands every
episode over with its turn, the in-turn prefix and the tool time left (`SimEpisodeInflight`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.protocols import Clock
from dynaresize.sim.costs import CostModel
from dynaresize.sim.device_types import EngineRequest, Lengths, SimCompletion, SimInflight
from dynaresize.sim.engine_model import SimEngine


@dataclass
class SimEpisodeInflight(SimInflight):
    """An exported episode: at turn `turn` with `num_generated` tokens of it done, or waiting
    `tool_left_s` more seconds for the tool that answers turn `turn - 1`."""

    turn: int = 0
    tool_left_s: float = 0.0


class TurnRequest(EngineRequest):
    __slots__ = ("episode_prompt_tokens", "turns", "turn", "cached_tokens",
                 "trajectory_tokens")

    def __init__(self, spec: RequestSpec, prompt_tokens: int,
                 turns: list[tuple[int, int, float]], turn: int, generated: int) -> None:
        context = prompt_tokens + sum(m + o for m, o, _ in turns[:turn])
        super().__init__(spec, context, turns[turn][0], generated)
        self.episode_prompt_tokens = prompt_tokens
        self.turns, self.turn = turns, turn
        self.cached_tokens = 0
        """Context tokens a kept KV (prefix cache) holds at admission: not prefilled."""
        self.trajectory_tokens = sum(m + o for m, o, _ in turns)


class MultiTurnEngine(SimEngine):
    """One device's engine over episodes (module docstring)."""

    def __init__(self, index: int, costs: CostModel, lengths: Lengths,
                 clock: Clock | None = None) -> None:
        super().__init__(index, costs, lengths)
        self.workload: Any = lengths.workload
        self.keep_kv = bool(self.workload.episode_model.keep_kv)
        self.clock = clock
        self._own_s = 0.0
        self._parked: list[tuple[float, int, TurnRequest]] = []
        self.tool_idle_s = 0.0
        """Seconds `run` spent with nothing to decode, waiting for tools."""
        self.num_turns = 0
        """Turns decoded to their end."""

    @property
    def is_empty(self) -> bool:
        return super().is_empty and not self._parked

    def _now(self) -> float:
        return self.clock.now() if self.clock is not None else self._own_s

    def submit(self, requests: list[RequestSpec | InflightRequest]) -> None:
        now = self._now()
        for work in requests:
            spec = work.spec if isinstance(work, InflightRequest) else work
            turn, done, left_s = 0, 0, 0.0
            if isinstance(work, SimEpisodeInflight):
                turn, done, left_s = work.turn, work.num_generated, work.tool_left_s
            elif isinstance(work, InflightRequest):
                raise ValueError(f"multi-turn engine {self.index}: an exported request of "
                                 f"{spec.key} without its turn (not a SimEpisodeInflight)")
            draw = self.workload.episodes(spec.step)
            turns = draw.turns(spec.prompt, spec.sample)
            prompt = int(self.workload.step_requests(spec.step).prompt_tokens[spec.prompt])
            req = TurnRequest(spec, prompt, turns, turn, done)
            if left_s > 0:
                heapq.heappush(self._parked, (now + left_s, next(self._seq), req))
            else:
                self._waiting.append(req)

    def _admit(self) -> float:
        """`SimEngine._admit`, less the prefill of a kept context."""
        prefill_tokens = 0
        limit, capacity = self.costs.max_running_requests, self.kv_capacity_tokens
        while self._waiting and len(self._running) < limit:
            req: Any = self._waiting[0]
            ctx = req.prompt_tokens + req.generated
            if ctx + 1 > capacity - self._kv_tokens - len(self._running) - 1 and self._running:
                break
            self._waiting.popleft()
            req.start_iter, req.live = self._iter, True
            self._running[req] = None
            self._kv_tokens += ctx
            prefill_tokens += ctx - req.cached_tokens
            req.cached_tokens = 0
            heapq.heappush(self._finish_heap, (self._iter + req.target_tokens - req.generated,
                                               next(self._seq), req))
        return self.costs.prefill_s(prefill_tokens) if prefill_tokens else 0.0

    def _wake(self, now: float) -> None:
        while self._parked and self._parked[0][0] <= now:
            self._waiting.append(heapq.heappop(self._parked)[2])

    def _end_turn(self, req: TurnRequest, now: float, version: int, done: list[Completion]
                  ) -> None:
        """Turn `req.turn` is decoded: the episode completes, or waits for its tool."""
        self.num_turns += 1
        model, obs, tool_s = req.turns[req.turn]
        if req.turn + 1 == len(req.turns):
            length = req.trajectory_tokens
            done.append(SimCompletion(req.spec, [length], [], "eos", self.index, version,
                                      length))
            return
        nxt = TurnRequest(req.spec, req.episode_prompt_tokens, req.turns, req.turn + 1, 0)
        if self.keep_kv:
            nxt.cached_tokens = req.prompt_tokens + model
        heapq.heappush(self._parked, (now + tool_s, next(self._seq), nxt))

    def run(self, max_s: float, until_empty: bool, version: int
            ) -> tuple[list[Completion], float]:
        """Decode, park finished turns, wake answered ones; stop as `SimEngine.run` does."""
        start, elapsed_s = self._now(), 0.0
        done: list[Completion] = []
        costs = self.costs
        while until_empty or not done:
            self._wake(start + elapsed_s)
            if self._waiting:
                elapsed_s += self._admit()
            if elapsed_s >= max_s:
                break
            if not self._running:
                if not self._parked:
                    break
                idle_s = min(self._parked[0][0] - start - elapsed_s, max_s - elapsed_s)
                idle_s = max(idle_s, 0.0)
                elapsed_s += idle_s
                self.tool_idle_s += idle_s
                continue
            heap = self._finish_heap
            while not heap[0][2].live:
                heapq.heappop(heap)
            batch, kv_tokens = len(self._running), self._kv_tokens
            kv_room = (self.kv_capacity_tokens - kv_tokens) // batch
            if kv_room <= 0:
                if batch == 1:
                    raise ValueError(f"simulated device {self.index}: one episode's turn "
                                     f"needs more than the {self.kv_capacity_tokens} KV-cache "
                                     "tokens one device holds under this cost model")
                self._preempt_youngest()
                continue
            n = min(heap[0][0] - self._iter, kv_room)
            until_s = max_s - elapsed_s
            if self._parked:  # stop at the next tool's answer: it joins the batch
                until_s = min(until_s, self._parked[0][0] - start - elapsed_s)
            if costs.span_scalar_s(n, batch, kv_tokens) > until_s:
                n = max(1, min(n, costs.decode_iters_within(until_s, batch, kv_tokens)))
            elapsed_s += costs.span_scalar_s(n, batch, kv_tokens)
            self._iter += n
            self._kv_tokens += n * batch
            while heap and heap[0][0] <= self._iter:
                req: Any = heapq.heappop(heap)[2]
                if req.live:
                    del self._running[req]
                    req.live = False
                    self._kv_tokens -= self._ctx(req)
                    self._end_turn(req, start + elapsed_s, version, done)
        if self.clock is None:
            self._own_s += elapsed_s
        return done, elapsed_s

    def kv_held_tokens(self) -> int:
        """Context tokens whose KV the engine holds: running turns', and the prefix kept for
        queued and parked episodes (`keep_kv`)."""
        kept = sum(r.cached_tokens for r in self._waiting)  # type: ignore[attr-defined]
        return int(self._kv_tokens) + kept + sum(r.cached_tokens for _, _, r in self._parked)

    def export(self) -> list[InflightRequest]:
        """Every episode: running and queued turns with their prefix, parked ones with the
        tool time left."""
        now = self._now()
        out: list[InflightRequest] = []
        for req in list(self._running):
            req.generated += self._iter - req.start_iter
        for req in [*self._running, *self._waiting]:
            r: Any = req
            out.append(SimEpisodeInflight(r.spec, num_generated=r.generated, turn=r.turn))
        for ready_s, _, r in sorted(self._parked):
            out.append(SimEpisodeInflight(r.spec, turn=r.turn,
                                          tool_left_s=max(ready_s - now, 1e-9)))
        self._running.clear()
        self._waiting.clear()
        self._finish_heap.clear()
        self._parked.clear()
        self._kv_tokens = 0
        return out
