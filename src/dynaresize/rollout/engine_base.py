"""What every rollout engine of a device is (`Engine`) and the part they share (`EngineBase`).

The builtin engine (`rollout.engine.RolloutEngine`) and the vLLM engine
(`rollout.vllm_engine.VllmRolloutEngine`) implement `Engine`; a device (`devices.actor`) holds
one through it. Both derive from `EngineBase`, which holds what they do alike: the accessors,
the guard on loading weights while requests of another version are held, queueing (`add`
refuses a request that could not run here, so nothing bad is queued), admission (a request
that fails it leaves the queue: the others still run), and the `run` loop over `step`. How a
request is decoded (`step`, `export_inflight`) is each engine's own. The twin's engine
(`sim.engine_model.SimEngine`) works in modelled time and is held by `SimDevice` behind the
same device seam (`protocols.RolloutOps`), not through `Engine`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.rollout.spec_stats import Counting


@dataclass
class EngineStats:
    """Monotonic counters of one engine (never reset by `export_inflight`)."""

    num_generated_tokens: int = 0
    """Tokens sampled (one per request per decode iteration)."""
    num_prefill_tokens: int = 0
    """Context tokens fed to rebuild caches on admission (prompts and migrated prefixes)."""
    num_decode_iterations: int = 0
    """`step` calls that decoded at least one request."""
    busy_s: float = 0.0
    """Wall seconds spent inside `step` with work to do."""


class Engine(Protocol):
    """A rollout engine serving one policy version on one device."""

    version: int
    stats: EngineStats
    speculation: Counting | None
    """Drafting state and acceptance counters (`rollout.speculative.Speculation`); None: off."""

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def tokens_in_flight(self) -> int: ...

    def load_weights(self, state_dict: Mapping[str, Any], version: int) -> None: ...

    def add(self, item: RequestSpec | InflightRequest) -> None: ...

    def add_all(self, items: Sequence[RequestSpec | InflightRequest]) -> None: ...

    def export_inflight(self) -> list[InflightRequest]: ...

    def step(self) -> list[Completion]: ...

    def run(self, max_s: float, until_empty: bool = False) -> list[Completion]: ...

    def release_kv(self) -> None: ...

    def alloc_kv(self) -> None: ...

    def shutdown(self) -> None: ...


class _InFlight(Protocol):
    spec: RequestSpec
    generated: list[int]


class EngineBase:
    """The common part of the rollout engines (module docstring). A subclass keeps its
    admitted requests (objects with `spec` and `generated`) and returns them from `_active`,
    and decodes in `step`; queued requests wait in `self._waiting`."""

    greedy_ok = True
    """Whether temperature 0 (greedy) is served; else requests need temperature > 0."""
    context_limit_name = "max_context_tokens"
    """The name of `max_context_tokens` in the engine's own terms (for refusals)."""

    def __init__(self, *, eos_token_id: int | None, device_index: int, max_running: int,
                 max_context_tokens: int | None = None, vocab_size: int | None = None) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.eos_token_id = eos_token_id
        self.device_index = device_index
        self.max_running = max_running
        self.max_context_tokens = max_context_tokens
        """Most tokens a request may reach, prompt + max_new_tokens (None: no limit)."""
        self.vocab_size = vocab_size
        """Token ids must be below this (None: not checked by `add`)."""
        self.version = 0
        self.stats = EngineStats()
        self._waiting: deque[InflightRequest] = deque()

    def _active(self) -> Collection[_InFlight]:
        raise NotImplementedError

    def step(self) -> list[Completion]:
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._active())

    @property
    def tokens_in_flight(self) -> int:
        """Context tokens (prompt + generated) of the running requests."""
        return sum(len(r.spec.prompt_tokens) + len(r.generated) for r in self._active())

    def _check_load(self, version: int) -> None:
        """Raise RuntimeError if requests of another version run or wait (export them first):
        every request an engine holds is of its version (`add` checks it), so a request is
        added after its version loads (as the rollout loop does, design §2)."""
        held = len(self._active()) + len(self._waiting)
        if held and version != self.version:
            raise RuntimeError(f"engine {self.device_index}: cannot load version {version} while "
                               f"{held} requests of version {self.version} run or wait (export "
                               f"them first)")

    # ------------------------------------------------------------------ requests in
    def add(self, item: RequestSpec | InflightRequest) -> None:
        """Queue a new request or a migrated one (continued from its prefix). One that could
        not run here is refused with a ValueError (`_check_request`) and not queued."""
        self.add_all([item])

    def add_all(self, items: Sequence[RequestSpec | InflightRequest]) -> None:
        """Queue every one of `items`, or none: each is checked (`_check_request`) before
        any is queued, so a refusal leaves the queue as it was (the caller retries or fails
        the whole batch, and nothing of it is served twice)."""
        queued = [InflightRequest(spec=i) if isinstance(i, RequestSpec) else i for i in items]
        for item in queued:
            self._check_request(item)
        self._waiting.extend(queued)

    def _check_request(self, item: InflightRequest) -> None:
        """Raise ValueError unless `item` can run here: sampling settings this engine serves,
        this engine's version, a prompt, as many log-probs as generated tokens, tokens left to
        generate, token ids in the vocabulary, a context that fits (`_check_context`)."""
        spec, num_done = item.spec, len(item.generated)
        if spec.temperature < 0 or (spec.temperature == 0 and not self.greedy_ok) \
                or spec.max_new_tokens < 1:
            need = ">= 0" if self.greedy_ok else "> 0"
            raise ValueError(f"request {spec.key}: need temperature {need} and max_new_tokens "
                             f">= 1, got {spec.temperature} and {spec.max_new_tokens}")
        if spec.version != self.version:
            raise ValueError(f"request {spec.key} needs version {spec.version}, engine "
                             f"{self.device_index} holds version {self.version} (add a request "
                             f"after its version loads)")
        if not spec.prompt_tokens:
            raise ValueError(f"request {spec.key} has an empty prompt")
        if num_done != len(item.logprobs):
            raise ValueError(f"request {spec.key}: {num_done} tokens but "
                             f"{len(item.logprobs)} log-probs")
        if num_done >= spec.max_new_tokens:
            raise ValueError(f"request {spec.key}: {num_done} tokens generated, nothing left "
                             f"of max_new_tokens {spec.max_new_tokens}")
        ids = (*spec.prompt_tokens, *item.generated)
        if self.vocab_size is not None and not 0 <= min(ids) <= max(ids) < self.vocab_size:
            bad = next(t for t in ids if not 0 <= t < self.vocab_size)
            raise ValueError(f"request {spec.key}: token id {bad} is outside engine "
                             f"{self.device_index}'s vocabulary (allowed: 0 <= id < "
                             f"{self.vocab_size})")
        self._check_context(item)

    def _check_context(self, item: InflightRequest) -> None:
        """Raise ValueError if `item` could outgrow the engine's context: its prompt plus
        `max_new_tokens` (for a migrated request: prompt + generated prefix + the rest)."""
        spec, limit = item.spec, self.max_context_tokens
        total = len(spec.prompt_tokens) + spec.max_new_tokens
        if limit is not None and total > limit:
            done = f" ({len(item.generated)} generated)" if item.generated else ""
            raise ValueError(f"request {spec.key}: {len(spec.prompt_tokens)} prompt tokens + "
                             f"{spec.max_new_tokens} max_new_tokens = {total}{done} exceed "
                             f"engine {self.device_index}'s {self.context_limit_name} {limit}; "
                             f"allowed: prompt + max_new_tokens <= {limit}")

    def _admit_waiting(self, admit: Callable[[InflightRequest], None]) -> None:
        """Admit queued requests, FIFO, by `admit` while fewer than `max_running` run. One
        that fails admission (what `add` cannot foresee) leaves the queue and its error is
        raised, noted with its key: the engine is not wedged, the others run next `step`."""
        while self._waiting and len(self._active()) < self.max_running:
            item = self._waiting.popleft()
            try:
                admit(item)
            except Exception as exc:
                exc.add_note(f"engine {self.device_index}: request {item.spec.key} failed "
                             f"admission and left the queue")
                raise

    # ------------------------------------------------------------------ decoding
    def run(self, max_s: float, until_empty: bool = False) -> list[Completion]:
        """Call `step` until at least one request finishes (`until_empty`: until none is left),
        `max_s` seconds pass, or the engine is empty; return the finished requests."""
        deadline = time.monotonic() + max_s
        finished: list[Completion] = []
        while (self._waiting or self._active()) and (until_empty or not finished):
            finished += self.step()
            if time.monotonic() >= deadline:
                break
        return finished

    # ------------------------------------------------------------------ memory
    def release_kv(self) -> None:
        """Free the KV cache (the engine is empty); nothing to do unless overridden."""
        return None

    def alloc_kv(self) -> None:
        """Make the KV cache ready again; nothing to do unless overridden."""
        return None

    def shutdown(self) -> None:
        """Free the engine's resources; nothing to do unless overridden."""
        return None
