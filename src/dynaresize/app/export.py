"""`dynaresize export RUN_DIR --out DIR` and `run.export_every`: the trained policy as a
Hugging Face folder that transformers (`AutoModelForCausalLM.from_pretrained(DIR)`,
`AutoTokenizer.from_pretrained(DIR)`) and vLLM (`vllm.LLM(DIR)`) load as it is:

    config.json  generation_config.json  model.safetensors  tokenizer.json
    tokenizer_config.json  (special_tokens_map.json, chat template: as the tokenizer has them)

The model is the one the run trained: the tiny default (its architecture from the run's
`[model]` table, its fixed character tokenizer written as a byte-level tokenizer with one
token per character, see `char_tokenizer_fast`), or the `model.path` / `model.source`
checkpoint with its own tokenizer. The built-in tasks (`count`, `jsonl`) always use the
character tokenizer, which is what is exported with them. Weights: RUN_DIR/model.pt
(written at the end of a run, `output.save_model`), else the newest checkpoint's weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dynaresize.config import Config, load_config

CHAR_TASKS = ("count", "jsonl")
"""Tasks that tokenize with `CharTokenizer` whatever the model."""


def run_weights_file(run_dir: Path) -> Path:
    """The final weights of a run directory: model.pt, else the newest checkpoint's newest
    weights; ValueError naming what is missing."""
    final = run_dir / "model.pt"
    if final.is_file():
        return final
    from dynaresize.orchestrator.checkpoint_files import read_latest

    try:
        ckpt, _ = read_latest(run_dir)
    except ValueError as exc:
        raise ValueError(f"{final} does not exist (output.save_model = false?) and {exc}"
                         ) from None
    weights = sorted(ckpt.glob("weights-v*.pt"), key=lambda p: int(p.stem.split("-v")[1]))
    if not weights:
        raise ValueError(f"{ckpt}: no weights-v*.pt in the newest checkpoint")
    return weights[-1]


def char_tokenizer_fast() -> Any:
    """The built-in `CharTokenizer` as a transformers tokenizer with the same ids: a Qwen2
    (byte-level BPE) tokenizer whose vocabulary is the characters and which has no merges, so
    every character is one token; what `AutoTokenizer` builds again from the saved files for
    a Qwen2 model. It adds no BOS: the built-in tasks start prompts with `bos_token_id`."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from dynaresize.tasks.tokenizer import BOS, CHARS, EOS, PAD, SPECIALS

    byte_char = bytes_to_unicode()  # ' ' is 'Ġ' in a byte-level vocabulary
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({byte_char[ord(c)]: i + len(SPECIALS) for i, c in enumerate(CHARS)})
    return Qwen2Tokenizer(vocab=vocab, merges=[], bos_token=BOS, eos_token=EOS,
                          pad_token=PAD, unk_token=None)


def _tokenizer_and_ids(cfg: Config) -> tuple[Any, int, int, int, int]:
    """(a transformers tokenizer to save, vocab size, eos, bos, pad) of the run's task."""
    if cfg.task.name in CHAR_TASKS:
        from dynaresize.tasks.tokenizer import CharTokenizer

        char = CharTokenizer()
        return char_tokenizer_fast(), char.vocab_size, char.eos_id, char.bos_id, char.pad_id
    from transformers import AutoTokenizer

    from dynaresize.tasks import model_dir, model_tokenizer

    tok = model_tokenizer(cfg)
    hf = AutoTokenizer.from_pretrained(model_dir(cfg), local_files_only=True)
    return hf, tok.vocab_size, tok.eos_id, tok.bos_id, tok.pad_id


def export_model(cfg: Config, state_dict: dict[str, Any], out_dir: str | Path) -> Path:
    """Write `state_dict` (the run's model) as an HF folder at `out_dir` (replaced if it
    exists; written under a temporary name first)."""
    from transformers.utils import logging as hf_logging

    from dynaresize.models import build_model

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in a run's progress
    out = Path(out_dir)
    tokenizer, vocab_size, eos, bos, pad = _tokenizer_and_ids(cfg)
    model = build_model(cfg.model, vocab_size, eos_token_id=eos, bos_token_id=bos,
                        pad_token_id=pad)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise ValueError(f"the run's weights do not fit its [model]: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.config.eos_token_id, model.config.bos_token_id = eos, bos
    model.config.pad_token_id = pad
    tmp = out.with_name(out.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    model.generation_config.save_pretrained(tmp)  # also when transformers skipped it
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """`dynaresize export`: RUN_DIR's config.toml and final weights → an HF folder."""
    import torch

    run = Path(run_dir)
    config = run / "config.toml"
    if not config.is_file():
        raise ValueError(f"{config}: not found ({run} is not a run directory)")
    cfg = load_config(config, [], check_machine=False)
    state_dict = torch.load(run_weights_file(run), weights_only=True)
    return export_model(cfg, state_dict, out_dir)
