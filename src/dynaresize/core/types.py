"""Plain data exchanged between the orchestrator and devices (no torch, no Ray).

Glossary: *device* (one GPU or CPU slot), *role* (rollout/train/idle), *allocation*
(devices per role), *resize* (a change of allocation), *op* (one step of a resize),
*version* (policy version: the weights after that many optimizer steps).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    ROLLOUT = "rollout"
    TRAIN = "train"
    IDLE = "idle"


def request_seed(run_seed: int, step: int, prompt: int, sample: int) -> int:
    """Seed of one request's sampler: a function of (run seed, step, prompt, sample) only."""
    digest = hashlib.sha256(struct.pack("<4q", run_seed, step, prompt, sample)).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def tokens_sha256(tokens: list[int]) -> str:
    """Hash of a response's token ids (little-endian int64), as recorded in samples.jsonl."""
    return hashlib.sha256(struct.pack(f"<{len(tokens)}q", *tokens)).hexdigest()


@dataclass(frozen=True)
class RequestSpec:
    """One response to generate: sample `sample` of prompt `prompt` in step `step`."""

    step: int
    prompt: int
    sample: int
    version: int
    """Policy version that must generate it (design §2.2)."""
    prompt_tokens: tuple[int, ...]
    max_new_tokens: int
    seed: int
    temperature: float = 1.0

    def __init__(self, step: int, prompt: int, sample: int, version: int,
                 prompt_tokens: tuple[int, ...], max_new_tokens: int, seed: int,
                 temperature: float = 1.0) -> None:
        # the dataclass's own frozen __init__ makes one object.__setattr__ call per field; one
        # dict update is ~2x faster (a step builds one spec per request: 8192 in the twin)
        self.__dict__.update(step=step, prompt=prompt, sample=sample, version=version,
                             prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens,
                             seed=seed, temperature=temperature)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.step, self.prompt, self.sample)


@dataclass
class InflightRequest:
    """A request exported from an engine mid-generation: enough to continue it elsewhere."""

    spec: RequestSpec
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rng_state: bytes | None = None
    """torch.Generator state after the tokens generated so far (None: not started)."""

    def num_done(self) -> int:
        """Response tokens generated so far."""
        return len(self.generated)


@dataclass
class Completion:
    """A finished response."""

    spec: RequestSpec
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    """'eos' or 'length'."""
    device: int
    engine_version: int

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.spec.prompt_tokens)


@dataclass
class TrainSample:
    """A completed, rewarded sample handed to the trainer."""

    step: int
    prompt: int
    sample: int
    prompt_tokens: list[int]
    response_tokens: list[int]
    behavior_logprobs: list[float]
    advantage: float
    reward: float
    group_tokens: int = 0
    """Response tokens of the sample's whole GRPO group (the 'group' loss aggregation's
    weight); 0: not known."""
    response_mask: list[int] | None = None
    """Multi-turn episodes: 1 where a response token was sampled by the model, 0 on the
    environment's tokens (no loss there). None: every response token is the model's."""

    @property
    def num_model_tokens(self) -> int:
        """Response tokens the model sampled (what the loss counts)."""
        if self.response_mask is None:
            return len(self.response_tokens)
        return sum(self.response_mask)
