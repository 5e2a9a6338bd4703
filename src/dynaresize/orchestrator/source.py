"""The task as the orchestrator sees it (`PromptSource`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PromptLike(Protocol):
    id: int
    tokens: tuple[int, ...]


class PromptSource(Protocol):
    """Seeded prompt batches and a verifiable reward."""

    def batch(self, step: int, num_prompts: int, seed: int) -> Sequence[PromptLike]: ...

    def reward(self, prompt: PromptLike, response_tokens: list[int]) -> float: ...
