"""Model-free drafters and the draft budget of exact speculative decoding (pure: no torch).

A drafter proposes the tokens a request is likely to generate next; the engine verifies them
by equality with the tokens its sampler draws (`rollout.verify`), so drafts change the speed,
never the tokens (docs/speculative.md). Three sources, each an n-gram index of token sequences
(the most recent continuation of every n-gram):

* ``prefix``: the request's own prompt and generated text (repeated phrases, copied numbers);
* ``siblings``: the text so far of the other responses to the same prompt in the same step
  (the GRPO group), running or finished, on this engine;
* ``history``: responses to the same prompt tokens in earlier steps (a bounded, LRU history).

`DraftPool.propose` takes the longest suffix of the request's context (``max_ngram`` down to
``min_ngram`` tokens) that occurs in any source and returns the tokens that followed it there.

`draft_budget` is length-aware: a request predicted to run long, on a lightly loaded engine,
gets up to ``max_draft_tokens``; a full batch, where verifying costs more than it saves, none.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dynaresize.rollout.spec_stats import SpeculationStats

if TYPE_CHECKING:
    from dynaresize.config.speculative import SpeculativeConfig

DRAFTERS = ("prefix", "siblings", "history")

MIN_ROWS = 4
"""Fewest rows a fixed-row forward may have: measured (torch 2.13, CPU fp32), a linear layer's
output row is bitwise the same for every row count >= 4, not for 1, 2 or 3."""

Key = tuple[int, int, int]
"""(step, prompt, sample) of a request."""


class NgramIndex:
    """A token sequence and, for every n-gram (n in [min_n, max_n]) that has a follower in it,
    the end of its most recent such occurrence; appended to token by token."""

    def __init__(self, tokens: list[int] | tuple[int, ...], min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: list[int] | tuple[int, ...]) -> None:
        seq = self.tokens
        for token in tokens:
            end = len(seq)  # the n-grams ending here are followed by `token`
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._ends[tuple(seq[end - n:end])] = end
            seq.append(token)

    def continuation(self, suffix: tuple[int, ...], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the most recent occurrence of `suffix`."""
        end = self._ends.get(suffix)
        return [] if end is None else self.tokens[end:end + limit]


def draft_budget(max_draft_tokens: int, *, remaining_tokens: int, predicted_remaining: float,
                 num_running: int, full_batch: int, long_tokens: int) -> int:
    """Draft tokens for one verify iteration of one request.

    - 0 when the engine runs `full_batch` requests or more (`full_batch` 0: never full);
    - scaled by how lightly loaded the engine is (1 - num_running / full_batch);
    - scaled by min(1, predicted_remaining / long_tokens) (`long_tokens` 0: no length scaling);
    - never more than `remaining_tokens - 1` (the verify emits one token beyond the drafts).
    """
    cap = min(max_draft_tokens, remaining_tokens - 1)
    if cap <= 0 or (full_batch > 0 and num_running >= full_batch):
        return 0
    scale = 1.0
    if full_batch > 0:
        scale *= 1.0 - num_running / full_batch
    if long_tokens > 0:
        scale *= min(1.0, max(0.0, predicted_remaining) / long_tokens)
    return max(1, min(cap, round(cap * scale))) if scale > 0 else 0


def predict_remaining(generated: int, finished_sibling_lengths: list[int],
                      max_new_tokens: int) -> float:
    """Tokens a request will still generate: its finished siblings' mean length minus its own
    progress, at least its own progress (a request that ran long is predicted long), capped by
    its length limit."""
    left = max_new_tokens - generated
    if finished_sibling_lengths:
        mean = sum(finished_sibling_lengths) / len(finished_sibling_lengths)
        guess = max(mean - generated, float(generated))
    else:
        guess = float(max(generated, 1))
    return min(float(left), guess)


@dataclass
class _Group:
    live: dict[int, NgramIndex] = field(default_factory=dict)
    """sample -> its sequence (prompt + generated) while it runs here."""
    finished: list[NgramIndex] = field(default_factory=list)
    finished_lengths: list[int] = field(default_factory=list)


class DraftPool:
    """The drafters' state of one engine: every running request's sequence, by GRPO group, and
    a bounded history of finished responses by prompt (module docstring)."""

    def __init__(self, drafters: tuple[str, ...] = DRAFTERS, *, min_ngram: int = 1,
                 max_ngram: int = 4, history_prompts: int = 256,
                 history_responses: int = 16) -> None:
        unknown = set(drafters) - set(DRAFTERS)
        if unknown:
            raise ValueError(f"unknown drafters {sorted(unknown)}; allowed: {DRAFTERS}")
        self.drafters = tuple(drafters)
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.history_prompts = history_prompts
        self.history_responses = history_responses
        self._own: dict[Key, NgramIndex] = {}
        self._groups: dict[tuple[int, int], _Group] = {}
        self._history: OrderedDict[tuple[int, ...], deque[NgramIndex]] = OrderedDict()
        self._prompt_of: dict[Key, tuple[int, ...]] = {}

    def start(self, key: Key, prompt_tokens: tuple[int, ...], generated: list[int]) -> None:
        """Register a request admitted with `generated` tokens so far (and forget the finished
        groups of earlier steps: bounded memory over a run)."""
        self.end_step(key[0])
        index = NgramIndex([*prompt_tokens, *generated], self.min_ngram, self.max_ngram)
        self._own[key] = index
        self._prompt_of[key] = tuple(prompt_tokens)
        self._groups.setdefault(key[:2], _Group()).live[key[2]] = index

    def extend(self, key: Key, tokens: list[int]) -> None:
        self._own[key].extend(tokens)

    def length(self, key: Key) -> int:
        """Tokens of `key`'s sequence (prompt and generated) the pool holds."""
        return len(self._own[key].tokens)

    def finish(self, key: Key, num_generated: int) -> None:
        """The request completed here: its text stays a sibling source and enters the history."""
        index = self._drop(key)
        group = self._groups.setdefault(key[:2], _Group())
        group.finished.append(index)
        group.finished_lengths.append(num_generated)
        if "history" in self.drafters and self.history_prompts > 0:
            prompt = self._prompt_of.pop(key)
            past = self._history.pop(prompt, None) or deque(maxlen=self.history_responses)
            past.append(index)
            self._history[prompt] = past
            while len(self._history) > self.history_prompts:
                self._history.popitem(last=False)
        else:
            self._prompt_of.pop(key)

    def remove(self, key: Key) -> None:
        """The request left this engine unfinished (exported)."""
        self._drop(key)
        self._prompt_of.pop(key)

    def end_step(self, step: int) -> None:
        """Forget the groups of steps before `step` (their text lives on in the history)."""
        for group_key in [g for g in self._groups if g[0] < step and not self._groups[g].live]:
            del self._groups[group_key]

    def finished_lengths(self, key: Key) -> list[int]:
        group = self._groups.get(key[:2])
        return list(group.finished_lengths) if group else []

    def propose(self, key: Key, limit: int) -> list[int]:
        """Up to `limit` draft tokens for `key`: the continuation of the longest suffix of its
        context found in a source (own prefix, then siblings, then history, at equal length)."""
        own = self._own[key]
        if limit <= 0:
            return []
        sources = self._sources(key, own)
        context = own.tokens
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            suffix = tuple(context[-n:])
            for source in sources:
                draft = source.continuation(suffix, limit)
                if draft:
                    return draft
        return []

    def _sources(self, key: Key, own: NgramIndex) -> list[NgramIndex]:
        sources = [own] if "prefix" in self.drafters else []
        if "siblings" in self.drafters:
            group = self._groups[key[:2]]
            sources += [s for sample, s in group.live.items() if sample != key[2]]
            sources += group.finished
        if "history" in self.drafters:
            sources += reversed(self._history.get(self._prompt_of[key], ()))
        return sources

    def _drop(self, key: Key) -> NgramIndex:
        index = self._own.pop(key)
        group = self._groups[key[:2]]
        group.live.pop(key[2], None)
        return index


@dataclass(frozen=True)
class SpeculationSettings:
    """What `rollout.speculative` asks of one engine (config/schema.py documents each)."""

    max_draft_tokens: int = 7
    drafters: tuple[str, ...] = DRAFTERS
    min_ngram: int = 1
    max_ngram: int = 4
    full_batch: int = 0
    long_tokens: int = 0
    history_prompts: int = 256
    history_responses: int = 16
    coupled: bool = True
    """vLLM: also coupled drafts (`rollout.coupled`); the builtin engine drafts tokens only."""


class Speculation:
    """One engine's drafting: the draft pool, the budget and the counters."""

    def __init__(self, settings: SpeculationSettings) -> None:
        self.settings = settings
        self.pool = DraftPool(settings.drafters, min_ngram=settings.min_ngram,
                              max_ngram=settings.max_ngram,
                              history_prompts=settings.history_prompts,
                              history_responses=settings.history_responses)
        self.stats = SpeculationStats()

    def drafts(self, key: Key, *, num_generated: int, max_new_tokens: int,
               num_running: int) -> list[int]:
        """Draft tokens for the next verify forward of request `key`."""
        return self.pool.propose(key, self.budget(key, num_generated=num_generated,
                                                  max_new_tokens=max_new_tokens,
                                                  num_running=num_running))

    def budget(self, key: Key, *, num_generated: int, max_new_tokens: int,
               num_running: int) -> int:
        """Draft tokens request `key` may get for its next verify forward (`draft_budget`)."""
        s = self.settings
        predicted = predict_remaining(num_generated, self.pool.finished_lengths(key),
                                      max_new_tokens)
        return draft_budget(s.max_draft_tokens, remaining_tokens=max_new_tokens - num_generated,
                            predicted_remaining=predicted, num_running=num_running,
                            full_batch=s.full_batch, long_tokens=s.long_tokens)


def settings_from_config(sp: SpeculativeConfig) -> SpeculationSettings | None:
    """`[rollout.speculative]` (a `SpeculativeConfig`) -> an engine's settings; None if off."""
    if not sp.enabled:
        return None
    return SpeculationSettings(
        max_draft_tokens=sp.max_draft_tokens,
        drafters=tuple(d.strip() for d in sp.drafters.split(",")),
        min_ngram=sp.min_ngram, max_ngram=sp.max_ngram, full_batch=sp.full_batch,
        long_tokens=sp.long_tokens, history_prompts=sp.history_prompts,
        history_responses=sp.history_responses, coupled=sp.coupled)
