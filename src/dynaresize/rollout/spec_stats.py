"""Exact speculative decoding's counters (pure): one engine's verify iterations
(`SpeculationStats`), a device's rollout counters over its engines' lives (`engine_counts`) and
the run's summary of every device's (`speculation_summary`, summary.json "speculation") and its
one-line text (`acceptance_line`: printed at a run's end, `dynaresize report`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class SpeculationStats:
    """Counters of one engine's verify iterations (monotonic)."""

    num_verify_iterations: int = 0
    """Forwards of a running request that carried at least one draft token."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_histogram: dict[int, int] = field(default_factory=dict)
    """accepted draft tokens -> verify iterations that accepted that many."""

    def record(self, num_drafts: int, num_accepted: int) -> None:
        self.num_verify_iterations += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        self.accepted_histogram[num_accepted] = self.accepted_histogram.get(num_accepted, 0) + 1


COUNTS = ("generated_tokens", "verify_iterations", "draft_tokens", "accepted_tokens")
"""A device's rollout counters over its engines' lives (`engine_counts`; the run's summary)."""


class GeneratedCount(Protocol):
    @property
    def num_generated_tokens(self) -> int: ...


class Counting(Protocol):
    """An engine's drafting state, as far as counting goes (`speculative.Speculation`)."""

    @property
    def stats(self) -> SpeculationStats: ...


class CountedEngine(Protocol):
    """What `engine_counts` reads of a rollout engine (the builtin and the vLLM engine)."""

    @property
    def stats(self) -> GeneratedCount: ...

    @property
    def speculation(self) -> Counting | None: ...


def engine_counts(engine: CountedEngine) -> dict[str, int]:
    """`COUNTS` of one engine (speculation's are 0 with it off)."""
    spec = engine.speculation
    stats = spec.stats if spec is not None else SpeculationStats()
    return {"generated_tokens": engine.stats.num_generated_tokens,
            "verify_iterations": stats.num_verify_iterations,
            "draft_tokens": stats.num_draft_tokens, "accepted_tokens": stats.num_accepted_tokens}


def speculation_summary(devices: list[dict[str, int]]) -> dict[str, Any]:
    """The run's speculation, from every device's `COUNTS`: each request's forward emits one
    token plus its accepted drafts, so tokens per forward is generated / (generated -
    accepted)."""
    total = {key: sum(d.get(key, 0) for d in devices) for key in COUNTS}
    forwards = total["generated_tokens"] - total["accepted_tokens"]
    return {**total, "tokens_per_forward":
            round(total["generated_tokens"] / forwards, 4) if forwards > 0 else None,
            "mean_accepted_per_verify": round(total["accepted_tokens"]
                                              / total["verify_iterations"], 4)
            if total["verify_iterations"] else None}


def acceptance_line(spec: dict[str, Any] | None) -> str | None:
    """summary.json's "speculation" as one line, or None where the run did not speculate."""
    if not spec or spec.get("tokens_per_forward") is None:
        return None
    return (f"speculative decoding: {spec['tokens_per_forward']:.2f} tokens per forward "
            f"({spec.get('accepted_tokens', 0)} of {spec.get('draft_tokens', 0)} draft tokens "
            "accepted)")
