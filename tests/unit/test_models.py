"""Model factory: deterministic tiny Qwen2 with the configured sizes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dynaresize.config import ModelConfig  # noqa: E402
from dynaresize.models import build_model, model_num_params, num_kv_heads  # noqa: E402
from dynaresize.tasks import CharTokenizer  # noqa: E402


def _build(cfg: ModelConfig):
    tok = CharTokenizer()
    return build_model(cfg, tok.vocab_size, eos_token_id=tok.eos_id, bos_token_id=tok.bos_id,
                       pad_token_id=tok.pad_id)


def test_build_model_is_deterministic_and_sized() -> None:
    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48)
    state_before = torch.random.get_rng_state()
    a, b = _build(cfg), _build(cfg)
    assert torch.equal(state_before, torch.random.get_rng_state())  # global RNG untouched
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = _build(ModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                           init_seed=cfg.init_seed + 1))
    assert not torch.equal(c.model.embed_tokens.weight, a.model.embed_tokens.weight)

    conf = a.config
    assert (conf.hidden_size, conf.num_hidden_layers, conf.num_attention_heads,
            conf.intermediate_size) == (32, 2, 4, 48)
    assert conf.num_key_value_heads == 2
    assert conf.vocab_size == CharTokenizer().vocab_size
    assert conf.max_position_embeddings >= 512
    assert a.lm_head.weight is a.model.embed_tokens.weight  # tied
    assert all(p.dtype == torch.float32 for p in a.parameters())
    assert len(a.model.layers) == 2
    assert 0 < model_num_params(a) < 100_000


def test_forward_shapes() -> None:
    model = _build(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32))
    ids = torch.tensor([CharTokenizer().encode_prompt("3*a")])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, 4, CharTokenizer().vocab_size)


def test_num_kv_heads() -> None:
    assert [num_kv_heads(h) for h in (1, 2, 3, 4, 5, 6, 8)] == [1, 1, 1, 2, 1, 3, 4]
    with pytest.raises(ValueError):
        num_kv_heads(0)


def test_bad_sizes() -> None:
    with pytest.raises(ValueError, match="divisible"):
        _build(ModelConfig(hidden_size=30, num_heads=4))
    with pytest.raises(ValueError, match="vocab_size"):
        build_model(ModelConfig(), 0, eos_token_id=2, bos_token_id=1, pad_token_id=0)
