"""Built-in task 'count': repeat a character a requested number of times, then stop.

Prompt `"<bos>7*c"` ("7 times c") asks for `"ccccccc<eos>"`. The required length L is heavy-tailed,

    L = min(max_answer_len, ceil(X)),  X ~ Pareto(x_m = 1, index = tail_alpha),

so P(L >= k) = (k - 1)^-alpha for k >= 2: most answers are 2–3 characters, a few reach the cap.
A policy that learns the task therefore produces long-tailed response lengths, the regime
dynaresize is built for (design §1).

The reward is dense so that a tiny randomly initialised model learns within a few GRPO steps:

    reward = CHAR_WEIGHT * (correct characters among the first L) / L
           + STOP_WEIGHT * [stopped] * (1 - |len(body) - L| / max(len(body), L))

where `body` is the response before its first EOS. The exact answer scores 1.0; random tokens
that run to the length cap score about 0.0. The task is about the *count*: stopping after the
right number of characters weighs more than the characters themselves, because that part is
what a tiny random model picks up within ~10 one-step-off GRPO steps (measured: mean reward
0.09 -> 0.25 over the default 16 steps); copying the character is learnt more slowly.
"""

from __future__ import annotations

import math
import random
import string

from dynaresize.tasks.base import IndexedTask, Prompt, seeded_rng, split_response
from dynaresize.tasks.tokenizer import CharTokenizer

CHAR_WEIGHT = 0.4
"""Share of the reward for the right characters at the right positions."""
STOP_WEIGHT = 0.6
"""Share of the reward for emitting EOS after (close to) the right number of characters."""
SYMBOLS = string.ascii_lowercase
"""Characters a prompt may ask to repeat."""


def answer_length(rng: random.Random, tail_alpha: float, max_answer_len: int) -> int:
    """One heavy-tailed answer length: `min(max_answer_len, ceil(Pareto(1, tail_alpha)))`."""
    if tail_alpha <= 0:
        raise ValueError(f"tail_alpha = {tail_alpha}: must be > 0")
    if max_answer_len < 1:
        raise ValueError(f"max_answer_len = {max_answer_len}: must be >= 1")
    u = 1.0 - rng.random()  # in (0, 1]
    x = u ** (-1.0 / tail_alpha)
    if x >= max_answer_len:
        return max_answer_len
    return max(1, math.ceil(x))


class CountTask(IndexedTask):
    """Repeat character c exactly L times, L heavy-tailed (see module docstring)."""

    name = "count"

    def __init__(self, max_answer_len: int = 32, tail_alpha: float = 1.2,
                 tokenizer: CharTokenizer | None = None) -> None:
        if max_answer_len < 1:
            raise ValueError(f"max_answer_len = {max_answer_len}: must be >= 1")
        if tail_alpha <= 0:
            raise ValueError(f"tail_alpha = {tail_alpha}: must be > 0")
        self.max_answer_len = max_answer_len
        self.tail_alpha = tail_alpha
        self.tokenizer = tokenizer or CharTokenizer()

    def prompt_at(self, index: int, seed: int) -> Prompt:
        """Prompt `index` of a run with seed `seed`: its own seeded draw of (c, L)."""
        rng = seeded_rng(seed, index)
        symbol = SYMBOLS[rng.randrange(len(SYMBOLS))]
        length = answer_length(rng, self.tail_alpha, self.max_answer_len)
        tokens = self.tokenizer.encode_prompt(f"{length}*{symbol}")
        return Prompt(id=index, tokens=tokens, answer=symbol * length)

    def reward(self, prompt: Prompt, response_tokens: list[int]) -> float:
        """Dense reward in [0, 1]; 1.0 exactly for `answer + EOS` (see module docstring)."""
        target = self.tokenizer.encode(prompt.answer)
        body, stopped = split_response(response_tokens, self.tokenizer.eos_id)
        want = len(target)
        if want == 0:
            return 1.0 if stopped and not body else 0.0
        correct = sum(1 for got, ref in zip(body, target) if got == ref)
        score = CHAR_WEIGHT * correct / want
        if stopped:
            score += STOP_WEIGHT * (1.0 - abs(len(body) - want) / max(len(body), want))
        return min(1.0, max(0.0, score))
