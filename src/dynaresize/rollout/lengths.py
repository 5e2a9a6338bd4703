"""LengthPredictor: how long a step's unfinished requests will be, from what the run has seen.

GRPO samples a group of responses per prompt, and their lengths are correlated (a hard prompt
gives long answers to every sample). So a group's finished siblings say much about its
unfinished ones, and a group whose requests are all still running after a while is long. The
predictor sees only what a scheduler sees: completions (their token counts), when each request
was dispatched, and the tokens of requests exported mid-generation. Never the true lengths.

Estimate of a group's unfinished requests (in log tokens, shrunk towards the run's prior)::

    log L_group = (k * mean(log finished) + w * log prior) / (k + w)
    L_unfinished = max(L_group, longest finished sibling, progress lower bound)

`prior` is the geometric mean of every completion of the run so far (`prior_tokens` until the
first one). The progress lower bound of a running request is its known generated tokens
(exported) or `rate * (now - dispatched)`, `rate` being the decode speed seen per request
(completion tokens / seconds since dispatch, a running mean): a group none of whose requests
finished is at least as long as its oldest request has been decoding.

Pure: no clock, no devices; `now_s` is passed in. Unit-tested in milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Key = tuple[int, int]
"""(prompt, sample) of one request in the run's step."""


@dataclass
class _Group:
    num_finished: int = 0
    sum_log: float = 0.0
    longest: int = 0
    running_s: dict[int, float] = field(default_factory=dict)
    """sample -> when that unfinished request was first dispatched."""
    progress: int = 0
    """Most tokens a still-running request of the group is known to have generated."""

    def progressed(self, num_tokens: int) -> None:
        self.progress = max(self.progress, num_tokens)

    def finished(self, num_tokens: int, log_tokens: float) -> None:
        self.num_finished += 1
        self.sum_log += log_tokens
        self.longest = max(self.longest, num_tokens)


@dataclass
class LengthPredictor:
    """Length estimates of one step's requests (module docstring)."""

    prior_tokens: float = 1000.0
    """Length assumed before any request of the run has finished."""
    prior_weight: float = 1.0
    """How many finished siblings the run's prior counts as in a group's estimate."""
    _groups: dict[int, _Group] = field(default_factory=dict)
    _num_finished: int = 0
    _sum_log: float = 0.0
    _rate_sum: float = 0.0
    _num_rates: int = 0

    def _group(self, prompt: int) -> _Group:
        group = self._groups.get(prompt)
        if group is None:
            group = self._groups[prompt] = _Group()
        return group

    def dispatched(self, key: Key, now_s: float) -> None:
        """`key` went to an engine at `now_s` (its first dispatch counts)."""
        self._group(key[0]).running_s.setdefault(key[1], now_s)

    def progressed(self, key: Key, num_tokens: int) -> None:
        """`key` is known to have generated `num_tokens` and to be unfinished (exported)."""
        self._group(key[0]).progressed(num_tokens)

    def finished(self, key: Key, num_tokens: int, now_s: float) -> None:
        """`key` completed with `num_tokens` response tokens at `now_s`."""
        group = self._group(key[0])
        log_tokens = math.log(max(1, num_tokens))
        group.finished(num_tokens, log_tokens)
        self._num_finished += 1
        self._sum_log += log_tokens
        start_s = group.running_s.pop(key[1], None)
        if start_s is not None and now_s > start_s:
            self._rate_sum += num_tokens / (now_s - start_s)
            self._num_rates += 1

    @property
    def prior_log(self) -> float:
        """Log length of the run's typical request (its completions' geometric mean)."""
        if self._num_finished:
            return self._sum_log / self._num_finished
        return math.log(self.prior_tokens)

    @property
    def tokens_per_s(self) -> float:
        """Mean decode speed of one request seen so far (0 before any completion)."""
        return self._rate_sum / self._num_rates if self._num_rates else 0.0

    def estimate(self, prompt: int, now_s: float) -> float:
        """Expected length (tokens) of `prompt`'s unfinished requests (module docstring)."""
        group = self._groups.get(prompt)
        prior = self.prior_log
        if group is None:
            return math.exp(prior)
        k, w = group.num_finished, self.prior_weight
        tokens = math.exp((group.sum_log + w * prior) / (k + w))
        tokens = max(tokens, group.longest, group.progress)
        if group.running_s and self._num_rates:
            oldest_s = min(group.running_s.values())
            tokens = max(tokens, self.tokens_per_s * (now_s - oldest_s))
        return tokens
