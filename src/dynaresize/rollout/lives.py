"""How long each request of a step lived, and the tail's tokens/s (pure).

A request lives from its first submission to an engine until its completion comes back: the
time it shares its engine's batches, moves to another engine (tail packing, a resize) or waits
behind a lost device's rerun. Its tokens/s is what speculation speeds up. The step's tail is
its longest requests by response tokens (`TAIL_FRACTION`, the longest quarter, the same cut as
`bench/speculative_vllm.py`); their tokens/s, summed tokens over summed lives, is the step's
`tail_tokens_per_s` (metrics.jsonl). The tokens are the same with speculation on and off
(design §2.3), so the same requests form the tail in both runs and the ratio compares like
with like.
"""

from __future__ import annotations

from collections.abc import Iterable

TAIL_FRACTION = 0.25
"""The share of a step's requests, longest first by response tokens, that forms its tail."""

Key = tuple[int, int, int]


class RequestLives:
    """First submission times of requests in flight, and the lives of finished ones."""

    def __init__(self) -> None:
        self._submitted_s: dict[Key, float] = {}
        self.lives: list[tuple[int, Key, float]] = []
        """(response tokens, request key, life in seconds) of each finished request."""

    def submitted(self, keys: Iterable[Key], now_s: float) -> None:
        """`keys` went to an engine at `now_s`; a request moved or rerun keeps its first."""
        first = self._submitted_s
        for key in keys:
            first.setdefault(key, now_s)

    def finished(self, key: Key, num_tokens: int, now_s: float) -> None:
        """The request `key` completed with `num_tokens` response tokens at `now_s`."""
        start_s = self._submitted_s.pop(key, now_s)
        self.lives.append((num_tokens, key, now_s - start_s))

    def tail_tokens_per_s(self, fraction: float = TAIL_FRACTION) -> float | None:
        """Tokens/s of the longest `fraction` of the finished requests (at least one; ties
        by request key), or None with none finished or no measurable time."""
        return tail_tokens_per_s(self.lives, fraction)


def tail_tokens_per_s(lives: list[tuple[int, Key, float]],
                      fraction: float = TAIL_FRACTION) -> float | None:
    """Summed response tokens over summed lives of the longest `fraction` of `lives`
    ((tokens, key, life_s) each; at least one request; ties by key)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction = {fraction}: allowed 0 < fraction <= 1")
    if not lives:
        return None
    num = max(1, int(len(lives) * fraction))
    tail = sorted(lives, key=lambda life: (life[0], life[1]))[-num:]
    life_s = sum(life[2] for life in tail)
    return sum(life[0] for life in tail) / life_s if life_s > 0 else None
