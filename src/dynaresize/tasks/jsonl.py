"""Task 'jsonl': prompts and reference answers from a JSON Lines file.

Each non-blank line is `{"prompt": str, "answer": str}` (other keys are ignored). Text is
tokenized character by character with the shared `CharTokenizer`; characters outside its
vocabulary are rejected when the file is loaded, naming the file, the line and the character.

Data order: the global prompt index `g = step * num_prompts + i` walks through epochs of the
dataset; each epoch is a permutation seeded by `(seed, epoch)`. The prompt id is `g`.

Reward: 1.0 for an exact match of the response (before its first EOS) with the answer, else the
similarity ratio of the two token sequences (`difflib.SequenceMatcher`), which is < 1.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

from dynaresize.tasks.base import IndexedTask, Prompt, seeded_rng, split_response
from dynaresize.tasks.tokenizer import CHARS, CharTokenizer

FIELDS = ("prompt", "answer")


def _check_text(path: Path, line_no: int, field: str, value: object,
                tokenizer: CharTokenizer) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{path}:{line_no}: field {field!r} must be a string, "
                         f"got {type(value).__name__}")
    bad = tokenizer.unknown_chars(value)
    if bad:
        raise ValueError(f"{path}:{line_no}: field {field!r} has character {bad[0]!r} outside "
                         f"the tokenizer vocabulary (allowed: {CHARS!r})")
    return value


def load_jsonl(path: str | os.PathLike[str],
               tokenizer: CharTokenizer | None = None) -> list[tuple[str, str]]:
    """(prompt, answer) pairs of a JSON Lines file; ValueError names file, line and field."""
    tok = tokenizer or CharTokenizer()
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: JSON Lines dataset not found")
    rows: list[tuple[str, str]] = []
    with p.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{p}:{line_no}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{p}:{line_no}: expected an object with fields "
                                 f"{', '.join(FIELDS)}, got {type(obj).__name__}")
            for field in FIELDS:
                if field not in obj:
                    raise ValueError(f"{p}:{line_no}: missing field {field!r}")
            prompt = _check_text(p, line_no, "prompt", obj["prompt"], tok)
            answer = _check_text(p, line_no, "answer", obj["answer"], tok)
            rows.append((prompt, answer))
    if not rows:
        raise ValueError(f"{p}: no prompts (the file has no non-blank lines)")
    return rows


class JsonlTask(IndexedTask):
    """Prompts from a JSON Lines file, epoch-wise seeded shuffling, exact/similarity reward."""

    name = "jsonl"

    def __init__(self, path: str | os.PathLike[str],
                 tokenizer: CharTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or CharTokenizer()
        self.path = Path(path)
        self.rows = load_jsonl(self.path, self.tokenizer)
        self._prompt_tokens = [self.tokenizer.encode_prompt(p) for p, _ in self.rows]
        self._perms: dict[tuple[int, int], list[int]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def _permutation(self, seed: int, epoch: int) -> list[int]:
        key = (seed, epoch)
        perm = self._perms.get(key)
        if perm is None:
            perm = list(range(len(self.rows)))
            seeded_rng(seed, epoch, len(self.rows)).shuffle(perm)
            if len(self._perms) > 8:
                self._perms.clear()
            self._perms[key] = perm
        return perm

    def prompt_at(self, index: int, seed: int) -> Prompt:
        """Prompt with global index `index`: row `perm(seed, epoch)[index % len]`."""
        epoch, offset = divmod(index, len(self.rows))
        row = self._permutation(seed, epoch)[offset]
        return Prompt(id=index, tokens=self._prompt_tokens[row], answer=self.rows[row][1])

    def reward(self, prompt: Prompt, response_tokens: list[int]) -> float:
        """1.0 for an exact match, else the token-sequence similarity ratio in [0, 1)."""
        target = self.tokenizer.encode(prompt.answer)
        body, _ = split_response(response_tokens, self.tokenizer.eos_id)
        if body == target:
            return 1.0
        return difflib.SequenceMatcher(None, body, target, autojunk=False).ratio()
