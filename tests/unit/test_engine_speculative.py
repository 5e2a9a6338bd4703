"""Exact speculative decoding on the builtin engine: fixed-row forwards are bitwise invariant in
the number of real positions, and speculation on/off (and migration) give identical samples."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from dynaresize.config import load_config
from dynaresize.config.schema import ConfigError
from dynaresize.core.types import Completion, RequestSpec, request_seed
from dynaresize.rollout.engine import RolloutEngine
from dynaresize.rollout.speculative import SpeculationSettings, settings_from_config
from dynaresize.rollout.verify import fixed_rows_forward, use_row_invariant_attention

torch.set_num_threads(1)

ROWS = 5


def make_model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                         max_position_embeddings=512, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("length", [40, 260])
def test_fixed_row_logits_do_not_depend_on_the_chunking(length):
    """Bitwise, also past ~192 keys (where plain eager attention's P @ V reduction splits)."""
    model = make_model()
    use_row_invariant_attention(model)
    seq = [(5 * i + 3) % 31 + 1 for i in range(length)]

    def logits(chunk: int) -> torch.Tensor:
        cache, out = DynamicCache(), []
        with torch.inference_mode():
            for i in range(0, len(seq), chunk):
                out.append(fixed_rows_forward(model, cache, seq[i:i + chunk], ROWS,
                                              cache_arg="past_key_values",
                                              device=torch.device("cpu")))
        assert cache.get_seq_length() == len(seq)
        return torch.cat(out)

    one = logits(1)
    for chunk in (2, 3, ROWS):
        assert torch.equal(logits(chunk), one), chunk  # bitwise


def specs(temperature: float) -> list[RequestSpec]:
    out = []
    for prompt in range(3):
        tokens = tuple(1 + (7 * prompt + 3 * i) % 31 for i in range(6))
        for sample in range(3):
            out.append(RequestSpec(step=0, prompt=prompt, sample=sample, version=0,
                                   prompt_tokens=tokens, max_new_tokens=30,
                                   seed=request_seed(7, 0, prompt, sample),
                                   temperature=temperature))
    return out


def engine(speculate: bool) -> RolloutEngine:
    settings = SpeculationSettings(max_draft_tokens=ROWS - 1, min_ngram=1, max_ngram=3)
    return RolloutEngine(make_model(), eos_token_id=0, device_index=0, max_running=4,
                         forward_rows=ROWS, speculation=settings if speculate else None)


def generate(temperature: float, speculate: bool, migrate_after: int = 0
             ) -> tuple[dict[tuple, tuple], RolloutEngine]:
    first, second = engine(speculate), engine(speculate)
    for s in specs(temperature):
        first.add(s)
    done: list[Completion] = []
    current = first
    for iteration in range(1, 1000):
        if not current.num_waiting and not current.num_running:
            break
        done += current.step()
        if iteration == migrate_after:
            for item in current.export_inflight():
                second.add(item)
            current = second
    return {c.spec.key: (tuple(c.tokens), tuple(c.logprobs), c.finish_reason) for c in done}, first


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculation_on_and_off_give_identical_samples(temperature):
    off, _ = generate(temperature, speculate=False)
    on, spec_engine = generate(temperature, speculate=True)
    migrated, _ = generate(temperature, speculate=True, migrate_after=4)
    assert len(off) == 9
    assert on == off
    assert migrated == off
    stats = spec_engine.speculation.stats
    assert stats.num_verify_iterations > 0
    assert sum(stats.accepted_histogram.values()) == stats.num_verify_iterations
    if temperature == 0.0:  # greedy on a random model repeats itself: drafts get accepted
        assert stats.num_accepted_tokens > 0


def test_engine_rejects_drafts_that_do_not_fit_the_rows():
    with pytest.raises(ValueError, match="max_draft_tokens < forward_rows"):
        RolloutEngine(make_model(), eos_token_id=0, device_index=0, forward_rows=4,
                      speculation=SpeculationSettings(max_draft_tokens=4))
    with pytest.raises(ValueError, match="batch_invariant"):
        RolloutEngine(make_model(), eos_token_id=0, device_index=0, forward_rows=4,
                      batch_invariant=False)


def test_config_speculative_keys():
    assert settings_from_config(load_config(check_machine=False).rollout.speculative) is None
    cfg = load_config(overrides=["rollout.speculative.enabled=true",
                                 "rollout.speculative.forward_rows=8",
                                 "rollout.speculative.drafters=prefix,history"],
                      check_machine=False)
    settings = settings_from_config(cfg.rollout.speculative)
    assert settings is not None and settings.drafters == ("prefix", "history")
    bad = [["rollout.speculative.enabled=true"],
           ["rollout.speculative.forward_rows=4", "rollout.speculative.enabled=true",
            "rollout.speculative.max_draft_tokens=4"],
           ["rollout.speculative.drafters=prefix,oracle"],
           ["rollout.speculative.forward_rows=4", "rollout.batch_invariant=false"],
           ["rollout.speculative.min_ngram=3", "rollout.speculative.max_ngram=2"]]
    vllm = ["rollout.engine='vllm'", "rollout.speculative.enabled=true"]
    assert settings_from_config(load_config(overrides=vllm, check_machine=False)
                                .rollout.speculative) is not None  # vLLM: no forward_rows
    bad += [[*vllm, "rollout.speculative.max_draft_tokens=129"],
            [*vllm, "rollout.speculative.forward_rows=8"]]
    for overrides in bad:
        with pytest.raises(ConfigError, match="rollout.speculative"):
            load_config(overrides=overrides, check_machine=False)


def test_fixed_block_attention_computes_causal_attention():
    """Same function as eager attention up to float rounding (over several key blocks)."""
    model = make_model()
    ids = torch.tensor([[(3 * i + 1) % 31 + 1 for i in range(150)]])
    with torch.inference_mode():
        model.set_attn_implementation("eager")
        eager = model(input_ids=ids).logits
        use_row_invariant_attention(model)
        blocked = model(input_ids=ids).logits
    assert (eager - blocked).abs().max() < 1e-4


def test_fixed_rows_need_one_torch_thread_on_cpu():
    # measured: at 2 threads a migrated request's logits differ for forward_rows 5-7 and 10
    with pytest.raises(ConfigError, match="devices.threads_per_device"):
        load_config(overrides=["rollout.speculative.forward_rows=8",
                               "devices.threads_per_device=2"], check_machine=False)


def test_fixed_block_attention_refuses_a_model_that_is_not_plain_causal():
    """It computes plain causal attention: a sliding window or soft-capping would sample
    from other logits than the model (and the trainer) compute."""
    from dynaresize.rollout.verify import not_plain_causal

    windowed = Qwen2Config(vocab_size=48, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                           use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert not_plain_causal(make_model().config) is None
    assert "sliding window" in not_plain_causal(windowed)
    assert "softcapping" in not_plain_causal(SimpleNamespace(attn_logit_softcapping=50.0))
    with pytest.raises(ValueError, match="forward_rows"):
        use_row_invariant_attention(Qwen2ForCausalLM(windowed))
