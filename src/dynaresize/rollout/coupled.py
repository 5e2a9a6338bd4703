"""Coupled drafts: the target's own next-token distributions, sampled with the request's own
noise (numpy; torch only to read logits; no vLLM).

Our sampler draws token `t` of a request as `argmax_i logits_i / T + G_i(seed, t)`
(`rollout.gumbel`), and the noise `G(seed, t)` is known before the logits are. A token drafter
(`rollout.speculative.DraftPool`) proposes what followed the same context elsewhere: a token
drawn there with *another* request's noise. At temperature 1 a sibling's next token at the same
context is a fresh sample, and it matches ours only as often as two samples agree.

A coupled drafter keeps, for every context it has seen verified (the last `min_n`..`max_n`
tokens, scoped to the prompt: the request's own prefix, its GRPO siblings, earlier steps'
responses, and the rows of rejected drafts, whose logits the verify forward computed anyway),
the target's top-`TOP_K` log-probs there (the last `MIX`, averaged; where the prompt has seen
the context nowhere, what any prompt saw after it). Its draft for position `t` is
`argmax_i logprob_i / T + G_i(seed, t)` over those tokens: the draw our sampler would make if
the target's distribution were the stored one. Where the stored distribution is close to the
real one, the two draws agree even where the distribution is flat (Gumbel-max coupling).

Exactness is untouched: the engine still keeps a draft iff it equals the token its sampler
draws (docs/speculative.md); this changes only which drafts are offered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from dynaresize.rollout.gumbel import gumbel_at

TOP_K = 32
"""Tokens kept per observed distribution (measured replay, T = 1: 8 -> 1.32 tokens per forward,
32 -> 1.35, 128 -> 1.37; docs/speculative.md)."""

MAX_ENTRIES = 200_000
"""Contexts one engine keeps over all prompts (~300 bytes each); the least recently used
prompt's are dropped first."""

SHARED_ENTRIES = 50_000
"""Contexts kept across prompts, the fallback where a prompt has seen none; the least recently
written first."""

MIX = 2
"""Observations kept per context, averaged when drafting (measured replay, T = 1, with the
shared fallback: 1 -> 1.390 tokens per forward, 2 -> 1.403, 4 -> 1.408; docs/speculative.md)."""

Observed = tuple[np.ndarray, np.ndarray]
"""(token ids int64 [k], their log-probs under softmax(logits), float32 [k]), best first; the
store keeps its own copies."""


class DistributionStore:
    """Per prompt, and across prompts, the `mix` most recent observed distributions after each
    context n-gram. A lookup prefers the prompt's own (its longest seen suffix), else the
    longest suffix seen in any prompt, and averages the probabilities of what it finds."""

    def __init__(self, min_n: int, max_n: int, max_entries: int = MAX_ENTRIES,
                 mix: int = MIX, shared_entries: int = SHARED_ENTRIES) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n} and {max_n}")
        if mix < 1 or shared_entries < 0:
            raise ValueError(f"need mix >= 1 and shared_entries >= 0, got {mix} and "
                             f"{shared_entries}")
        self.min_n, self.max_n, self.max_entries = min_n, max_n, max_entries
        self.mix, self.shared_entries = mix, shared_entries
        self._groups: OrderedDict[tuple[int, ...], dict[tuple[int, ...], list[Observed]]] = \
            OrderedDict()
        self._shared: OrderedDict[tuple[int, ...], list[Observed]] = OrderedDict()
        self._size = 0

    @property
    def size(self) -> int:
        """Contexts held per prompt, over all prompts (the shared ones not counted)."""
        return self._size

    def observe(self, group: tuple[int, ...], context: Sequence[int], observed: Observed
                ) -> None:
        """The target's distribution after `context` (its last `max_n` tokens are used)."""
        entries = self._groups.pop(group, None)
        if entries is None:
            entries = {}
        self._groups[group] = entries  # most recently used last
        tail = tuple(int(t) for t in context[-self.max_n:])
        own = (np.array(observed[0], dtype=np.int64), np.array(observed[1], dtype=np.float32))
        for n in range(self.min_n, min(self.max_n, len(tail)) + 1):
            key = tail[len(tail) - n:]
            if key not in entries:
                self._size += 1
            self._push(entries.setdefault(key, []), own)
            if self.shared_entries:
                self._push(self._shared.setdefault(key, []), own)
                self._shared.move_to_end(key)
        while self._size > self.max_entries and len(self._groups) > 1:
            _, dropped = self._groups.popitem(last=False)
            self._size -= len(dropped)
        while len(self._shared) > self.shared_entries:
            self._shared.popitem(last=False)

    def _push(self, kept: list[Observed], observed: Observed) -> None:
        kept.append(observed)
        if len(kept) > self.mix:
            del kept[0]

    def lookup(self, group: tuple[int, ...], context: Sequence[int]) -> Observed | None:
        """The distribution stored after the longest suffix of `context` seen for `group`,
        else in any prompt (the mean of its last `mix` observations); None if none."""
        tail = tuple(int(t) for t in context[-self.max_n:])
        for entries in (self._groups.get(group), self._shared):
            if not entries:
                continue
            for n in range(len(tail), self.min_n - 1, -1):
                found = entries.get(tail[len(tail) - n:])
                if found is not None:
                    return _mean(found)
        return None


def _mean(kept: list[Observed]) -> Observed:
    """The mixture of `kept` (probabilities averaged over the union of their tokens; a token
    missing from one counts as 0 there)."""
    if len(kept) == 1:
        return kept[0]
    ids, where = np.unique(np.concatenate([k[0] for k in kept]), return_inverse=True)
    probs = np.bincount(where, weights=np.exp(np.concatenate([k[1] for k in kept])))
    return ids, np.log(probs / len(kept)).astype(np.float32)


def coupled_drafts(store: DistributionStore, group: tuple[int, ...], context: Sequence[int],
                   *, seed: int, first_t: int, temperature: float, limit: int) -> list[int]:
    """Up to `limit` drafts for positions `first_t`, `first_t + 1`, ... of the request with
    `seed` after `context`: each the coupled draw from the distribution stored after the
    context so far (drafts included); stops at the first context with none stored."""
    tail = [int(t) for t in context[-store.max_n:]]
    drafts: list[int] = []
    for d in range(limit):
        found = store.lookup(group, tail)
        if found is None:
            break
        ids, logprobs = found
        scores = logprobs.astype(np.float64) / temperature + gumbel_at(seed, first_t + d, ids)
        token = int(ids[int(np.argmax(scores))])
        drafts.append(token)
        tail = [*tail[1:], token] if len(tail) >= store.max_n else [*tail, token]
    return drafts


def top_logprobs(logits: torch.Tensor, k: int = TOP_K) -> Observed:
    """The `k` most likely tokens of each row of `logits` [rows, vocab] (any device) and their
    log-probs under softmax(logits), on the host: (int64 [rows, k], float32 [rows, k])."""
    values, ids = torch.log_softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]),
                                                                  dim=-1)
    return ids.cpu().numpy(), values.cpu().numpy()
