"""A tiny local transformers checkpoint with its own (character-level BPE) tokenizer: the real
path of a pretrained model (`model.path`, the model's tokenizer end to end) without the 135M
SmolLM2 weights. Shared by the text-task tests."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dynaresize.config import Config

CHARS = "0123456789 +-=*()\n<>/abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,?:$%'"
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({c: len(SPECIALS) + i for i, c in enumerate(CHARS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(path)


def write_tiny_checkpoint(path: Path, seed: int = 0) -> Path:
    """A random 2-layer Llama (hidden 32) and its tokenizer in `path`; returns `path`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    write_tokenizer(path)
    config = LlamaConfig(vocab_size=len(SPECIALS) + len(CHARS), hidden_size=32,
                         intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        LlamaForCausalLM(config).save_pretrained(path)
    return path


def tiny_arithmetic_config(path: Path, num_eval_prompts: int) -> Config:
    """A 2-step reasoning-gym arithmetic run on the tiny checkpoint (written in `path`),
    evaluated every step on `num_eval_prompts` held-out prompts."""
    from dynaresize.config import load_config

    checkpoint = write_tiny_checkpoint(path)
    return load_config(None, [f"model.path='{checkpoint}'", "task.name='reasoning_gym'",
                              "task.generator='basic_arithmetic'",
                              "task.question_template='{expression} ='",
                              "task.max_new_tokens=4", "eval.every=1",
                              f"eval.num_prompts={num_eval_prompts}", "run.steps=2"],
                       check_machine=False)
