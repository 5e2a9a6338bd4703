"""Shared machinery of the text tasks (`reasoning_gym`, `math`): prompt formats, answer
extraction, held-out evaluation sets.

Prompt formats (`task.format`):

* `completion`: plain text with `task.num_fewshot` solved examples, one per line,
  `"{question} {answer}\n" * k + "{question}"`; the answer is the response's first line.
  A base or small model continues the pattern; the fixed few-shot examples are drawn once per
  run from their own seeded stream.
* `chat`: the model's chat template with one user message (the question, plus the task's
  answer instruction); the answer is the text inside the last `<answer>…</answer>`, else the
  whole response.

The reward is `score(extracted answer, prompt)` in [0, 1]; responses are decoded from their
tokens before the first EOS with the model's own tokenizer.

Held-out sets (`eval_prompts`) come from a seeded stream of their own; the training stream
skips any item whose question is in the held-out set, so the two are disjoint.
"""

from __future__ import annotations

import re
from typing import Any

from dynaresize.tasks.base import IndexedTask, Prompt, seeded_rng, split_response
from dynaresize.tasks.model_tokenizer import Tokenizer

FORMATS = ("completion", "chat")
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
EVAL_STREAM = 1
FEWSHOT_STREAM = 2
MAX_SKIPS = 64
SKIP_STRIDE = 7919
"""A training item held out for evaluation is replaced by the item this many places on."""


def stream_seed(seed: int, stream: int) -> int:
    """A 62-bit seed of stream `stream` (0 train, 1 eval, 2 few-shot) of run seed `seed`."""
    return seeded_rng(seed, stream, 0x7E57).getrandbits(62)


def extract_answer(text: str, fmt: str) -> str:
    """The answer part of a decoded response (see module docstring)."""
    if fmt == "completion":
        return text.strip().split("\n", 1)[0].strip() if text.strip() else ""
    found = ANSWER_TAG.findall(text)
    return found[-1].strip() if found else text.strip()


class TextTask(IndexedTask):
    """A question/answer source with a text reward; subclasses supply `item` and `score`."""

    instruction = ""
    """Chat format: appended to the question (how to mark the answer)."""

    def __init__(self, tokenizer: Tokenizer, fmt: str, num_fewshot: int,
                 num_eval: int = 0) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"task.format = {fmt!r}: allowed: {', '.join(FORMATS)}")
        self.tokenizer = tokenizer
        self.format = fmt
        self.num_fewshot = num_fewshot
        self.num_eval = num_eval
        self._eval_questions: dict[int, set[str]] = {}
        self._prefix: dict[int, str] = {}

    # ------------------------------------------------------------------ subclasses
    def item(self, stream: int, index: int, seed: int) -> tuple[str, str, Any]:
        """(question, reference answer, metadata) of item `index` of stream `stream`."""
        raise NotImplementedError

    def score(self, answer: str, prompt: Prompt) -> float:
        """Reward in [0, 1] of an extracted answer."""
        raise NotImplementedError

    # ------------------------------------------------------------------ prompts
    def _held_out(self, seed: int) -> set[str]:
        if seed not in self._eval_questions:
            self._eval_questions[seed] = {self.item(EVAL_STREAM, i, seed)[0]
                                          for i in range(self.num_eval)}
        return self._eval_questions[seed]

    def fewshot_prefix(self, seed: int) -> str:
        if seed not in self._prefix:
            shots = [self.item(FEWSHOT_STREAM, i, seed) for i in range(self.num_fewshot)]
            self._prefix[seed] = "".join(f"{q} {a}\n" for q, a, _ in shots)
        return self._prefix[seed]

    def render(self, question: str, seed: int) -> tuple[int, ...]:
        """Token ids of the prompt for `question` in the configured format."""
        if self.format == "chat":
            text = f"{question}\n{self.instruction}".strip()
            return self.tokenizer.chat([{"role": "user", "content": text}])  # type: ignore
        return self.tokenizer.encode_prompt(self.fewshot_prefix(seed) + question)

    def prompt_at(self, index: int, seed: int) -> Prompt:
        """Training prompt `index`: item `index` of the training stream, or (if its question
        is held out) of `index + j * SKIP_STRIDE` for the first j that is not."""
        held_out = self._held_out(seed)
        for j in range(MAX_SKIPS):
            question, answer, meta = self.item(0, index + j * SKIP_STRIDE, seed)
            if question not in held_out:
                break
        else:
            raise ValueError(f"task: {MAX_SKIPS} candidates for prompt {index} are all held "
                             "out for evaluation (the task has too few distinct items)")
        return Prompt(id=index, tokens=self.render(question, seed), answer=answer, meta=meta)

    def eval_prompts(self, num_prompts: int, seed: int) -> list[Prompt]:
        """The held-out evaluation set (ids -1, -2, …: never a training prompt id)."""
        out = []
        for i in range(num_prompts):
            question, answer, meta = self.item(EVAL_STREAM, i, seed)
            out.append(Prompt(id=-1 - i, tokens=self.render(question, seed), answer=answer,
                              meta=meta))
        return out

    # ------------------------------------------------------------------ reward
    def response_text(self, response_tokens: list[int]) -> str:
        body, _ = split_response(response_tokens, self.tokenizer.eos_id)
        return self.tokenizer.decode(body)

    def reward(self, prompt: Prompt, response_tokens: list[int]) -> float:
        answer = extract_answer(self.response_text(response_tokens), self.format)
        if not answer:
            return 0.0
        return min(1.0, max(0.0, float(self.score(answer, prompt))))
