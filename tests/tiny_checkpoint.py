"""A tiny local transformers checkpoint with its own (character-level BPE) tokenizer: the real
path of a pretrained model (`model.path`, the model's tokenizer end to end) without the 135M
SmolLM2 weights. Shared by the text-task tests."""

from __future__ import annotations

from pathlib import Path

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
