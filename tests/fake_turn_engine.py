"""A fake engine for the episode tests: continuous batching in virtual time, tokens a pure
function of (request seed, position), like the project's counter-based samplers, so a
migrated or restarted request produces the same tokens."""

from __future__ import annotations

import hashlib
import struct
from collections import deque

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.protocols import Clock

EOS = 2
VOCAB = 40


def fake_token(seed: int, position: int) -> int:
    """Token at `position` of a request with `seed` (3..VOCAB-1, or EOS about 1 in 6)."""
    digest = hashlib.sha256(struct.pack("<2q", seed, position)).digest()
    value = int.from_bytes(digest[:4], "little")
    return EOS if value % 6 == 0 else 3 + value % (VOCAB - 3)


class FakeEngine:
    """`max_running` requests decode one token each per `step`, which takes `step_s`."""

    def __init__(self, clock: Clock, device: int, step_s: float = 0.01, max_running: int = 4,
                 version: int = 0) -> None:
        self.clock = clock
        self.device = device
        self.step_s = step_s
        self.max_running = max_running
        self.version = version
        self._waiting: deque[InflightRequest] = deque()
        self._running: list[InflightRequest] = []

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def add(self, item: RequestSpec | InflightRequest) -> None:
        self._waiting.append(item if isinstance(item, InflightRequest)
                             else InflightRequest(spec=item))

    def export_inflight(self) -> list[InflightRequest]:
        out = [*self._running, *self._waiting]
        self._running, self._waiting = [], deque()
        return out

    async def step(self) -> list[Completion]:
        while self._waiting and len(self._running) < self.max_running:
            self._running.append(self._waiting.popleft())
        await self.clock.sleep(self.step_s)
        done, keep = [], []
        for req in self._running:
            spec = req.spec
            token = fake_token(spec.seed, len(spec.prompt_tokens) + len(req.generated))
            req.generated.append(token)
            req.logprobs.append(-0.5)
            if token == EOS or len(req.generated) >= spec.max_new_tokens:
                done.append(Completion(spec, list(req.generated), list(req.logprobs),
                                       "eos" if token == EOS else "length", self.device,
                                       self.version))
            else:
                keep.append(req)
        self._running = keep
        return done
