"""Validation of a parsed Config (pure, no torch): every bad value raises `ConfigError` naming
the field, the value and what is allowed."""

from __future__ import annotations

from pathlib import Path

from dynaresize.config.checks import fraction, non_negative, one_of, positive
from dynaresize.config.literal import toml_repr
from dynaresize.config.schema import (
    ADVANTAGES,
    AGGREGATIONS,
    BACKENDS,
    DEVICE_TYPES,
    ENGINES,
    KL_ESTIMATORS,
    MOVES,
    PROGRESS,
    RATIOS,
    TAIL_POLICIES,
    TASKS,
    TEXT_FORMATS,
    Config,
    ConfigError,
    ResizeEntry,
)
from dynaresize.config.validate_env import validate_env
from dynaresize.config.validate_machine import validate_machine, validate_ray
from dynaresize.config.validate_speculative import validate_speculative
from dynaresize.model_sources import SOURCES, missing_requirement

# ----------------------------------------------------------------------------- validation


def _is_file(path: str, directory_ok: bool = False) -> bool:
    """Whether `path` names an existing file (or directory); a malformed path is just absent."""
    try:
        p = Path(path)
        return p.is_file() or (directory_ok and p.is_dir())
    except (OSError, ValueError):
        return False


def _validate_loss(cfg: Config) -> None:
    loss = cfg.train.loss
    for name in ("clip_low", "clip_high", "entropy_coef", "overlong_window",
                 "overlong_penalty"):
        non_negative(f"train.loss.{name}", getattr(loss, name))
    if loss.clip_low >= 1:
        raise ConfigError("train.loss.clip_low", loss.clip_low, "must be < 1")
    one_of("train.loss.aggregation", loss.aggregation, AGGREGATIONS)
    one_of("train.loss.advantage", loss.advantage, ADVANTAGES)
    one_of("train.loss.ratio", loss.ratio, RATIOS)
    one_of("train.loss.kl_estimator", loss.kl_estimator, KL_ESTIMATORS)
    positive("train.dynamic_sampling.max_rounds", cfg.train.dynamic_sampling.max_rounds)
    non_negative("train.dynamic_sampling.margin", cfg.train.dynamic_sampling.margin)
    if loss.overlong_window > cfg.task.max_new_tokens:
        raise ConfigError("train.loss.overlong_window", loss.overlong_window,
                          f"must be <= task.max_new_tokens = {cfg.task.max_new_tokens}")


MAX_STALENESS = 8
"""Deepest fixed staleness: the rollout loop runs up to s steps ahead of training, buffering up
to s steps of samples and keeping s + 1 weight versions."""


def validate(cfg: Config, *, check_machine: bool = True, check_packages: bool = True) -> None:
    """Raise ConfigError on the first bad value. `check_machine`: also what this machine
    offers (devices, vLLM); `check_packages`: also that a `model.source`'s package is
    installed (only a real run needs it)."""
    r, t, m, a = cfg.run, cfg.task, cfg.train, cfg.allocation
    positive("run.steps", r.steps)
    if isinstance(r.staleness, bool) or not isinstance(r.staleness, int) \
            or not 0 <= r.staleness <= MAX_STALENESS:
        raise ConfigError("run.staleness", r.staleness, f"allowed: 0 (on-policy) .. "
                          f"{MAX_STALENESS} (every sample of step k from version k - s)")
    non_negative("run.checkpoint_every", r.checkpoint_every)
    non_negative("run.export_every", r.export_every)
    for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
        positive(f"model.{name}", getattr(cfg.model, name))
    if cfg.model.hidden_size % cfg.model.num_heads:
        raise ConfigError("model.hidden_size", cfg.model.hidden_size,
                          f"must be divisible by model.num_heads = {cfg.model.num_heads}")
    if cfg.model.path and not _is_file(cfg.model.path, directory_ok=True):
        raise ConfigError("model.path", cfg.model.path, "no such local path (no downloads)")
    _validate_model_source(cfg, check_packages)
    one_of("task.name", t.name, TASKS)
    if t.name == "jsonl" and not _is_file(t.path):
        raise ConfigError("task.path", t.path, "task 'jsonl' needs an existing JSON Lines file")
    _validate_text_task(cfg)
    positive("task.prompts_per_step", t.prompts_per_step)
    positive("task.samples_per_prompt", t.samples_per_prompt)
    if t.samples_per_prompt < 2:
        raise ConfigError("task.samples_per_prompt", t.samples_per_prompt,
                          "must be >= 2 (GRPO normalises rewards within a group)")
    positive("task.max_new_tokens", t.max_new_tokens)
    positive("task.max_answer_len", t.max_answer_len)
    positive("task.tail_alpha", t.tail_alpha)
    positive("rollout.max_running_requests", cfg.rollout.max_running_requests)
    non_negative("rollout.pack_batch", cfg.rollout.pack_batch)
    positive("rollout.temperature", cfg.rollout.temperature)
    positive("rollout.slice_s", cfg.rollout.slice_s)
    one_of("rollout.engine", cfg.rollout.engine, ENGINES)
    one_of("rollout.tail_policy", cfg.rollout.tail_policy, TAIL_POLICIES)
    positive("rollout.vllm_kv_cache_bytes", cfg.rollout.vllm_kv_cache_bytes)
    validate_speculative(cfg)
    positive("train.lr", m.lr)
    non_negative("train.weight_decay", m.weight_decay)
    positive("train.micro_batch_size", m.micro_batch_size)
    if cfg.global_batch_size % m.micro_batch_size:
        raise ConfigError(
            "train.micro_batch_size", m.micro_batch_size,
            f"must divide the global batch of {cfg.global_batch_size} samples "
            f"(task.prompts_per_step x task.samples_per_prompt)")
    non_negative("train.max_tokens_per_micro_batch", m.max_tokens_per_micro_batch)
    positive("train.clip_eps", m.clip_eps)
    non_negative("train.kl_coef", m.kl_coef)
    non_negative("train.max_grad_norm", m.max_grad_norm)
    if m.gradient_checkpointing and not m.exact_reduction:
        raise ConfigError("train.gradient_checkpointing", True,
                          "needs train.exact_reduction = true (it applies to the exact path)")
    _validate_loss(cfg)
    positive("allocation.num_rollout_devices", a.num_rollout_devices)
    positive("allocation.num_train_devices", a.num_train_devices)
    _validate_controller(cfg)
    positive("resize.staging_bytes", cfg.resize.staging_bytes)
    _validate_schedule(cfg)
    _validate_faults(cfg)
    one_of("devices.backend", cfg.devices.backend, BACKENDS)
    one_of("devices.type", cfg.devices.type, DEVICE_TYPES)
    positive("devices.threads_per_device", cfg.devices.threads_per_device)
    if not 0 < cfg.devices.gpus_per_device <= 1:
        raise ConfigError("devices.gpus_per_device", cfg.devices.gpus_per_device,
                          "must be in (0, 1]")
    one_of("output.progress", cfg.output.progress, PROGRESS)
    validate_ray(cfg)
    validate_env(cfg)
    if check_machine and cfg.devices.backend == "ray":
        validate_machine(cfg)


def _validate_controller(cfg: Config) -> None:
    h, b = cfg.controller.hysteresis, cfg.controller.borrow
    non_negative("controller.hysteresis.band", h.band)
    non_negative("controller.hysteresis.min_dwell_steps", h.min_dwell_steps)
    positive("controller.hysteresis.horizon_steps", h.horizon_steps)
    non_negative("controller.hysteresis.cost_margin", h.cost_margin)
    non_negative("controller.hysteresis.resize_guess_s", h.resize_guess_s)
    positive("controller.hysteresis.tail_batch", h.tail_batch)
    non_negative("controller.hysteresis.lend_min_cv", h.lend_min_cv)
    for name in ("min_remaining_fraction", "return_fraction", "borrow_fraction"):
        fraction(f"controller.borrow.{name}", getattr(b, name))
    non_negative("controller.borrow.min_train_devices", b.min_train_devices)
    non_negative("controller.borrow.window_factor", b.window_factor)
    non_negative("controller.borrow.prior_switch_s", b.prior_switch_s)


TEXT_TASKS = ("reasoning_gym", "math")


def _validate_model_source(cfg: Config, check_packages: bool) -> None:
    if not cfg.model.source:
        return
    if cfg.model.path:
        raise ConfigError("model.source", cfg.model.source,
                          f"set model.source or model.path, not both (model.path = "
                          f"{toml_repr(cfg.model.path)})")
    if cfg.model.source not in SOURCES:
        raise ConfigError("model.source", cfg.model.source,
                          f"unknown model source; allowed: {', '.join(sorted(SOURCES))}")
    problem = missing_requirement(cfg.model.source) if check_packages else None
    if problem:
        raise ConfigError("model.source", cfg.model.source, problem)


def _validate_text_task(cfg: Config) -> None:
    """Text tasks and evaluation (whether a generator or file exists is checked when the task
    is built, still before any device starts)."""
    t, e = cfg.task, cfg.eval
    one_of("task.format", t.format, TEXT_FORMATS)
    non_negative("task.num_fewshot", t.num_fewshot)
    positive("task.dataset_size", t.dataset_size)
    non_negative("eval.every", e.every)
    positive("eval.num_prompts", e.num_prompts)
    non_negative("eval.max_new_tokens", e.max_new_tokens)
    if cfg.model.source and t.name not in TEXT_TASKS:
        raise ConfigError("task.name", t.name, f"model.source = {toml_repr(cfg.model.source)} is "
                          "pretrained with its own tokenizer; task "
                          f"{toml_repr(t.name)} uses the tiny model's 53-character one: use a text "
                          f"task ({', '.join(TEXT_TASKS)})")
    if t.name in TEXT_TASKS and not (cfg.model.source or cfg.model.path):
        raise ConfigError("task.name", t.name, "a text task needs a pretrained model with its "
                          "own tokenizer: set model.source (e.g. 'smollm2-135m') or model.path")
    if t.name == "reasoning_gym" and not t.generator:
        raise ConfigError("task.generator", t.generator,
                          "task 'reasoning_gym' needs a generator name, e.g. 'chain_sum'")
    if t.name == "math" and not t.path:
        raise ConfigError("task.path", t.path, "task 'math' needs a local dataset file")
    if e.every and t.name not in TEXT_TASKS:
        raise ConfigError("eval.every", e.every,
                          f"evaluation needs a held-out set: task.name in {', '.join(TEXT_TASKS)}")


HANG_SHARE = 0.75
"""`faults.hang_timeout_s` at most this share of `faults.timeout_s`: the watchdog kills a
frozen device up to two ping intervals (2 x 10%) after the timeout (`devices.watchdog`)."""


def _validate_faults(cfg: Config) -> None:
    positive("faults.timeout_s", cfg.faults.timeout_s)
    hang_s, most_s = cfg.faults.hang_timeout_s, HANG_SHARE * cfg.faults.timeout_s
    if hang_s != 0 and not 1.0 <= hang_s <= most_s:
        raise ConfigError("faults.hang_timeout_s", hang_s,
                          f"0 (off), or from 1 to {HANG_SHARE} x faults.timeout_s ({most_s:g}): "
                          "a frozen trainer is killed up to two pings after it, and must be "
                          "before its peers' collectives time out")
    for i, e in enumerate(cfg.faults.kill):
        name = f"faults.kill[{i}]"
        one_of(f"{name}.how", e.how, ("kill", "hang"))
        if e.how == "hang" and hang_s == 0:
            raise ConfigError(f"{name}.how", e.how, "'hang' needs faults.hang_timeout_s > 0 "
                              "(else nothing ends the frozen device)")
        if not 0 <= e.device < cfg.num_devices:
            raise ConfigError(f"{name}.device", e.device,
                              f"must be in 0..{cfg.num_devices - 1} (the run's devices)")
        if not 0 <= e.step < cfg.run.steps:
            raise ConfigError(f"{name}.step", e.step, f"must be in 0..{cfg.run.steps - 1}")
        head, _, frac = e.at.partition(":")
        try:
            ok = e.at in ("train", "resize") or (head == "rollout" and 0.0 <= float(frac) < 1.0)
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"{name}.at", e.at,
                              "allowed: 'rollout:F' with 0 <= F < 1, 'train', 'resize'")
    if len(cfg.faults.kill) >= cfg.num_devices - 1:
        raise ConfigError("faults.kill", f"{len(cfg.faults.kill)} kills",
                          f"at most {cfg.num_devices - 2} with {cfg.num_devices} devices "
                          "(each pool keeps a device)")


def _validate_schedule(cfg: Config) -> None:
    """Refuse forced resizes up front: bad fields, or a sequence that would empty a pool."""
    num_rollout = cfg.allocation.num_rollout_devices
    num_train = cfg.allocation.num_train_devices
    indexed = list(enumerate(cfg.resize.schedule))
    for i, e in indexed:
        name = f"resize.schedule[{i}]"
        if not 0 <= e.step < cfg.run.steps:
            raise ConfigError(f"{name}.step", e.step,
                              f"must be in 0..{cfg.run.steps - 1} (run.steps = {cfg.run.steps})")
        if e.at != "start":
            head, _, frac = e.at.partition(":")
            try:
                ok = head == "rollout" and 0.0 < float(frac) < 1.0
            except ValueError:
                ok = False
            if not ok:
                raise ConfigError(f"{name}.at", e.at,
                                  "allowed: 'start' or 'rollout:F' with 0 < F < 1")
        one_of(f"{name}.move", e.move, MOVES)
        positive(f"{name}.num_devices", e.num_devices)
    for i, e in sorted(indexed, key=lambda ie: (ie[1].step, ie[1].fraction, ie[0])):
        sign = 1 if e.move == "rollout->train" else -1
        num_rollout -= sign * e.num_devices
        num_train += sign * e.num_devices
        if num_rollout < 1 or num_train < 1:
            raise ConfigError(f"resize.schedule[{i}]", f"{e.move} x{e.num_devices} at step "
                              f"{e.step} {e.at}", f"would leave {num_rollout} rollout and "
                              f"{num_train} train devices; each pool needs at least 1")


def schedule_order(cfg: Config) -> list[ResizeEntry]:
    """Forced resizes in the order they apply: by step, then 'start' first, then by F."""
    indexed = list(enumerate(cfg.resize.schedule))
    return [e for _, e in sorted(indexed, key=lambda ie: (ie[1].step, ie[1].fraction, ie[0]))]
