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
the target's top-`TOP_K` log-probs there. Its draft for position `t` is
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

Observed = tuple[np.ndarray, np.ndarray]
"""(token ids int64 [k], their log-probs under softmax(logits), float32 [k]), best first; the
store keeps its own copies."""


class DistributionStore:
    """Per prompt, the most recent observed distribution after each context n-gram."""

    def __init__(self, min_n: int, max_n: int, max_entries: int = MAX_ENTRIES) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n} and {max_n}")
        self.min_n, self.max_n, self.max_entries = min_n, max_n, max_entries
        self._groups: OrderedDict[tuple[int, ...], dict[tuple[int, ...], Observed]] = \
            OrderedDict()
        self._size = 0

    @property
    def size(self) -> int:
        """Contexts held, over all prompts."""
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
            entries[key] = own
        while self._size > self.max_entries and len(self._groups) > 1:
            _, dropped = self._groups.popitem(last=False)
            self._size -= len(dropped)

    def lookup(self, group: tuple[int, ...], context: Sequence[int]) -> Observed | None:
        """The distribution stored after the longest suffix of `context` seen for `group`."""
        entries = self._groups.get(group)
        if not entries:
            return None
        tail = tuple(int(t) for t in context[-self.max_n:])
        for n in range(len(tail), self.min_n - 1, -1):
            found = entries.get(tail[len(tail) - n:])
            if found is not None:
                return found
        return None


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
