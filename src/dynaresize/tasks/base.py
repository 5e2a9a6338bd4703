"""What a task is: a seeded prompt source plus a verifiable reward.

A task never sees the allocation, the timing or the devices: the prompts of step `k` are a pure
function of `(seed, step, num_prompts)` (design §2.1) and the reward a pure function of the prompt
and the response tokens. Prompt ids are global indices `step * num_prompts + i`, so they are
unique across the steps of a run (whose `num_prompts` is fixed) and deterministic.
"""

from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from dynaresize.tasks.tokenizer import CharTokenizer


@dataclass(frozen=True)
class Prompt:
    """One prompt of a step's batch."""

    id: int
    """Unique within a run: the prompt's global index `step * num_prompts + i`."""
    tokens: tuple[int, ...]
    """Prompt token ids, BOS first."""
    answer: str
    """The reference answer (text, without EOS)."""
    meta: Any = field(default=None, compare=False, hash=False, repr=False)
    """Task data the reward needs besides the answer (e.g. a reasoning-gym entry)."""


@runtime_checkable
class Task(Protocol):
    """A prompt source with a verifiable reward."""

    name: str
    tokenizer: CharTokenizer

    def batch(self, step: int, num_prompts: int, seed: int) -> list[Prompt]:
        """The prompts of step `step`: a pure function of `(seed, step, num_prompts)`."""
        ...

    def reward(self, prompt: Prompt, response_tokens: list[int]) -> float:
        """Reward in [0, 1] of one response (token ids, EOS included if it stopped)."""
        ...


def global_index(step: int, num_prompts: int, i: int) -> int:
    """Global index (and prompt id) of prompt `i` of step `step`."""
    if step < 0:
        raise ValueError(f"step = {step}: must be >= 0")
    if num_prompts <= 0:
        raise ValueError(f"num_prompts = {num_prompts}: must be > 0")
    return step * num_prompts + i


def seeded_rng(*parts: int) -> random.Random:
    """A `random.Random` whose stream depends only on the integers `parts` (any platform)."""
    packed = struct.pack(f"<{len(parts)}q", *parts)
    digest = hashlib.sha256(b"dynaresize.task" + packed).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def split_response(tokens: list[int] | tuple[int, ...], eos_id: int) -> tuple[list[int], bool]:
    """(tokens before the first EOS, whether an EOS was produced)."""
    body: list[int] = []
    for tok in tokens:
        tok = int(tok)
        if tok == eos_id:
            return body, True
        body.append(tok)
    return body, False


class IndexedTask:
    """Shared `batch()` for tasks whose prompt `g` is built from its global index alone."""

    name: str = ""
    tokenizer: CharTokenizer

    def prompt_at(self, index: int, seed: int) -> Prompt:
        """The prompt with global index `index` under run seed `seed`."""
        raise NotImplementedError

    def batch(self, step: int, num_prompts: int, seed: int) -> list[Prompt]:
        """The prompts of step `step`: global indices `step*num_prompts … +num_prompts-1`."""
        first = global_index(step, num_prompts, 0)
        return [self.prompt_at(first + i, seed) for i in range(num_prompts)]
