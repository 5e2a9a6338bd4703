"""Task plugins: a seeded prompt source plus a verifiable reward, chosen by `task.name`.

    from dynaresize.tasks import make_task
    task = make_task(cfg)                       # cfg.task.name in TASK_REGISTRY
    prompts = task.batch(step, cfg.task.prompts_per_step, cfg.run.seed)
    r = task.reward(prompts[0], response_tokens)

New tasks register a factory `Config -> Task` with `@register_task("name")` (and the name
must be added to `config.TASKS` for config validation to accept it).

`count` and `jsonl` use the fixed `CharTokenizer` (the tiny model's); the text tasks
(`reasoning_gym`, `math`) use the pretrained model's own tokenizer (`model_tokenizer`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dynaresize.tasks.base import Prompt, Task, split_response
from dynaresize.tasks.count import CountTask
from dynaresize.tasks.jsonl import JsonlTask, load_jsonl
from dynaresize.tasks.model_tokenizer import ModelTokenizer
from dynaresize.tasks.tokenizer import CharTokenizer

if TYPE_CHECKING:
    from dynaresize.config import Config

TaskFactory = Callable[["Config"], Task]
TASK_REGISTRY: dict[str, TaskFactory] = {}


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    """Decorator: register `factory(cfg) -> Task` under `name`."""

    def deco(factory: TaskFactory) -> TaskFactory:
        if name in TASK_REGISTRY:
            raise ValueError(f"task {name!r} is already registered")
        TASK_REGISTRY[name] = factory
        return factory

    return deco


@register_task("count")
def _make_count(cfg: Config) -> Task:
    return CountTask(max_answer_len=cfg.task.max_answer_len, tail_alpha=cfg.task.tail_alpha)


@register_task("jsonl")
def _make_jsonl(cfg: Config) -> Task:
    if not cfg.task.path:
        raise ValueError("task.path = '': task 'jsonl' needs a JSON Lines file")
    return JsonlTask(cfg.task.path)


_TOKENIZERS: dict[str, ModelTokenizer] = {}


def model_dir(cfg: Config, report: Callable[[str], None] | None = None) -> str:
    """The local folder of the configured pretrained model (materialising a source once)."""
    if cfg.model.source:
        from dynaresize.model_sources import ensure_source

        return str(ensure_source(cfg.model.source, report))
    return cfg.model.path


def model_tokenizer(cfg: Config) -> ModelTokenizer:
    """The pretrained model's own tokenizer (loaded once per process and folder)."""
    path = model_dir(cfg)
    if not path:
        raise ValueError("a text task needs model.source or model.path (its tokenizer)")
    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = ModelTokenizer(path)
    return _TOKENIZERS[path]


@register_task("reasoning_gym")
def _make_reasoning_gym(cfg: Config) -> Task:
    from dynaresize.tasks.rgym import ReasoningGymTask

    t = cfg.task
    return ReasoningGymTask(t.generator, t.generator_args, model_tokenizer(cfg), t.format,
                            t.num_fewshot, cfg.eval.num_prompts, t.question_template,
                            t.dataset_size)


@register_task("math")
def _make_math(cfg: Config) -> Task:
    from dynaresize.tasks.math_task import MathTask

    t = cfg.task
    return MathTask(t.path, t.question_field, t.answer_field, model_tokenizer(cfg), t.format,
                    t.num_fewshot, cfg.eval.num_prompts, cfg.run.seed)


def make_task(cfg: Config) -> Task:
    """The task named by `cfg.task.name`; ValueError for an unknown name or bad data."""
    factory = TASK_REGISTRY.get(cfg.task.name)
    if factory is None:
        raise ValueError(f"task.name = {cfg.task.name!r}: allowed: "
                         f"{', '.join(sorted(TASK_REGISTRY))}")
    return factory(cfg)


__all__ = [
    "TASK_REGISTRY",
    "CharTokenizer",
    "CountTask",
    "JsonlTask",
    "Prompt",
    "Task",
    "load_jsonl",
    "make_task",
    "model_dir",
    "model_tokenizer",
    "register_task",
    "split_response",
]
