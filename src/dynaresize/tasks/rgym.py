"""Task 'reasoning_gym': any of reasoning-gym's seeded problem generators, its own
`score_answer` as the reward.

    [task]
    name = "reasoning_gym"
    generator = "chain_sum"                       # any generator name reasoning-gym registers
    generator_args = {min_digits = 2, max_digits = 2, min_terms = 2, max_terms = 2}
    question_template = "{expression} ="          # default "{question}"

`task.question_template` builds the question from the entry's `question` and its `metadata`
fields (here chain_sum's bare expression, for short few-shot completion prompts).

Item `i` of a stream is entry `i` of `create_dataset(generator, seed=stream seed, ...)`, which
reasoning-gym derives from `Random(seed + i)` alone: prompts are a pure function of (run seed,
index), as design §2.1 asks. The training stream has `task.dataset_size` items (prompt `g` is
item `g mod size`): a few generators build every item up front (measured: `acre` 43 s for
65,536 items, `word_ladder` refuses that many), so the size is bounded; the held-out and
few-shot streams hold only what they need. The package is optional (`pip install reasoning-gym`, or
`bash scripts/setup.sh --with-real`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from dynaresize.config.schema import ConfigError
from dynaresize.tasks.base import Prompt
from dynaresize.tasks.model_tokenizer import Tokenizer
from dynaresize.tasks.text import TextTask, stream_seed

INSTALL = "pip install reasoning-gym==0.1.25 (or: bash scripts/setup.sh --with-real)"


def generator_names() -> list[str]:
    """Every generator reasoning-gym registers (ConfigError if it is not installed)."""
    if importlib.util.find_spec("reasoning_gym") is None:
        raise ConfigError("task.name", "reasoning_gym", f"needs the package: {INSTALL}")
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


class ReasoningGymTask(TextTask):
    """Prompts and rewards of one reasoning-gym generator."""

    name = "reasoning_gym"
    instruction = "Give only the final answer inside <answer></answer>."

    def __init__(self, generator: str, generator_args: dict[str, Any], tokenizer: Tokenizer,
                 fmt: str = "completion", num_fewshot: int = 3, num_eval: int = 0,
                 question_template: str = "{question}", dataset_size: int = 10000) -> None:
        names = generator_names()
        if generator not in names:
            raise ConfigError("task.generator", generator,
                              f"allowed (reasoning-gym generators): {', '.join(names)}")
        super().__init__(tokenizer, fmt, num_fewshot, num_eval)
        self.generator = generator
        self.generator_args = dict(generator_args)
        self.question_template = question_template
        self.sizes = {0: dataset_size, 1: max(1, num_eval), 2: max(1, num_fewshot)}
        self._datasets: dict[int, Any] = {}
        self.item(0, 0, 0)  # bad generator_args or template fail now, naming the field

    def _dataset(self, dataset_seed: int, size: int) -> Any:
        ds = self._datasets.get(dataset_seed)
        if ds is None:
            import reasoning_gym

            try:
                ds = reasoning_gym.create_dataset(self.generator, seed=dataset_seed,
                                                  size=size, **self.generator_args)
            except (TypeError, ValueError, AssertionError) as exc:
                raise ConfigError("task.generator_args", self.generator_args,
                                  f"not accepted by generator {self.generator!r}: {exc}") \
                    from None
            if len(self._datasets) > 8:
                self._datasets.clear()
            self._datasets[dataset_seed] = ds
        return ds

    def item(self, stream: int, index: int, seed: int) -> tuple[str, str, Any]:
        size = self.sizes.get(stream, 1)
        ds = self._dataset(stream_seed(seed, stream), size)
        entry = ds[index % size]
        fields = {**(entry.get("metadata") or {}), "question": entry["question"]}
        try:
            question = self.question_template.format_map(fields)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError("task.question_template", self.question_template,
                              f"fields of a {self.generator!r} entry: "
                              f"{', '.join(sorted(fields))} ({exc!r})") from None
        return question, str(entry["answer"]), (ds, entry)

    def score(self, answer: str, prompt: Prompt) -> float:
        ds, entry = prompt.meta
        return float(ds.score_answer(answer, entry))
