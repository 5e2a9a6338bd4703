"""Task 'math': problems and reference answers from a local dataset file, scored with
math-verify (`\\boxed{0.5}` equals `1/2`).

    [task]
    name = "math"
    path = "data/train.jsonl"        # .json / .jsonl / .parquet / .csv, loaded with `datasets`
    question_field = "problem"
    answer_field = "answer"

The file is read once, offline (`HF_DATASETS_OFFLINE=1`); a row without a named field fails at
load time naming the file, the row and the field. The held-out evaluation set is
`eval.num_prompts` rows picked by a seeded permutation; training walks seeded epochs over the
remaining rows, so the two are disjoint. Optional packages: `pip install datasets math-verify`
(or `bash scripts/setup.sh --with-real`).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from dynaresize.config.schema import ConfigError
from dynaresize.tasks.base import Prompt, seeded_rng
from dynaresize.tasks.model_tokenizer import Tokenizer
from dynaresize.tasks.text import TextTask

INSTALL = "pip install datasets math-verify (or: bash scripts/setup.sh --with-real)"
LOADERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def load_rows(path: str | os.PathLike[str], question_field: str,
              answer_field: str) -> list[tuple[str, str]]:
    """(question, answer) rows of a local dataset file; ValueError names file, row and field."""
    for module in ("datasets", "math_verify"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError("task.name", "math", f"needs the package {module}: {INSTALL}")
    p = Path(path)
    kind = LOADERS.get(p.suffix.lower())
    if kind is None:
        raise ConfigError("task.path", str(p), f"allowed suffixes: {', '.join(LOADERS)}")
    if not p.is_file():
        raise ConfigError("task.path", str(p), "no such file")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.load_dataset(kind, data_files=str(p), split="train")
    rows: list[tuple[str, str]] = []
    for i, row in enumerate(ds):
        out = []
        for name in (question_field, answer_field):
            value = row.get(name)
            if value is None:
                have = ", ".join(sorted(k for k, v in row.items() if v is not None))
                raise ValueError(f"{p}: row {i + 1}: missing field {name!r} (has: {have})")
            out.append(str(value))
        rows.append((out[0], out[1]))
    if not rows:
        raise ValueError(f"{p}: no rows")
    return rows


class MathTask(TextTask):
    """Rows of a local dataset, math-verify reward (1.0 if equivalent, else 0.0)."""

    name = "math"
    instruction = "Put the final answer in \\boxed{}."

    def __init__(self, path: str, question_field: str, answer_field: str, tokenizer: Tokenizer,
                 fmt: str = "chat", num_fewshot: int = 0, num_eval: int = 0,
                 seed: int = 0) -> None:
        self.rows = load_rows(path, question_field, answer_field)
        if num_eval >= len(self.rows):
            raise ConfigError("eval.num_prompts", num_eval,
                              f"must be < the {len(self.rows)} rows of {path} (the rest train)")
        super().__init__(tokenizer, fmt, 0, num_eval)
        self.num_fewshot = num_fewshot
        order = list(range(len(self.rows)))
        seeded_rng(seed, len(self.rows), 0xE7A1).shuffle(order)
        self._eval_rows = order[:num_eval]
        self._fewshot_rows = order[num_eval:num_eval + num_fewshot]
        self._train_rows = order[num_eval:]
        self._perms: dict[tuple[int, int], list[int]] = {}

    def _train_row(self, index: int, seed: int) -> int:
        epoch, offset = divmod(index, len(self._train_rows))
        key = (seed, epoch)
        if key not in self._perms:
            perm = list(self._train_rows)
            seeded_rng(seed, epoch, len(perm)).shuffle(perm)
            if len(self._perms) > 8:
                self._perms.clear()
            self._perms[key] = perm
        return self._perms[key][offset]

    def item(self, stream: int, index: int, seed: int) -> tuple[str, str, Any]:
        if stream == 0:
            row = self._train_row(index, seed)
        elif stream == 1:
            row = self._eval_rows[index]
        else:
            row = self._fewshot_rows[index % max(1, len(self._fewshot_rows))]
        question, answer = self.rows[row]
        return question, answer, None

    def _held_out(self, seed: int) -> set[str]:
        return set()  # rows are split by index: disjoint by construction

    def score(self, answer: str, prompt: Prompt) -> float:
        from math_verify import parse, verify

        gold = parse(prompt.answer if "\\boxed" in prompt.answer
                     else f"\\boxed{{{prompt.answer}}}")
        pred = parse(answer)
        try:
            return 1.0 if gold and pred and verify(gold, pred) else 0.0
        except Exception:  # math-verify raises on some unparsable input: a wrong answer
            return 0.0
