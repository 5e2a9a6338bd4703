"""Rollout engine: seeded sampling, batch invariance, migration, stops, log-probs, admission."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from dynaresize.core.types import Completion, InflightRequest, RequestSpec, request_seed
from dynaresize.rollout.engine import RolloutEngine

torch.set_num_threads(1)

EOS = 0


def make_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                         max_position_embeddings=256, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config)


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in make_model().state_dict().items()}


def make_engine(weights: dict[str, torch.Tensor], *, max_running: int = 32,
                device_index: int = 0, eos: int = EOS,
                batch_invariant: bool = True) -> RolloutEngine:
    """A fresh engine over a differently initialised model, then loaded with `weights`."""
    engine = RolloutEngine(make_model(seed=123), eos_token_id=eos, device_index=device_index,
                           max_running=max_running, batch_invariant=batch_invariant)
    engine.load_weights(weights, version=0)
    return engine


def spec(prompt: int, *, sample: int = 0, max_new: int = 12, plen: int = 5,
         temperature: float = 1.0, version: int = 0) -> RequestSpec:
    prompt_tokens = tuple(1 + (7 * prompt + 3 * i) % 31 for i in range(plen + prompt % 3))
    return RequestSpec(step=0, prompt=prompt, sample=sample, version=version,
                       prompt_tokens=prompt_tokens, max_new_tokens=max_new,
                       seed=request_seed(7, 0, prompt, sample), temperature=temperature)


def drain(engine: RolloutEngine, max_steps: int = 1000) -> dict[tuple, Completion]:
    done: dict[tuple, Completion] = {}
    for _ in range(max_steps):
        if not engine.num_waiting and not engine.num_running:
            return done
        for c in engine.step():
            done[c.spec.key] = c
    raise AssertionError("engine did not drain")


def test_same_request_alone_or_in_a_batch_gives_identical_tokens(weights):
    target = spec(1, max_new=16)
    alone = make_engine(weights)
    alone.add(target)
    solo = drain(alone)[target.key]

    crowded = make_engine(weights, max_running=4, device_index=3)
    for p in range(2, 8):  # others join and leave around it (continuous batching)
        crowded.add(spec(p, max_new=3 + p))
    crowded.add(target)
    together = drain(crowded)[target.key]

    assert together.tokens == solo.tokens
    assert together.logprobs == solo.logprobs
    assert together.finish_reason == solo.finish_reason
    assert (solo.device, together.device) == (0, 3)


def test_different_seeds_give_different_samples(weights):
    engine = make_engine(weights)
    a, b = spec(1, sample=0, max_new=16), spec(1, sample=1, max_new=16)
    engine.add(a)
    engine.add(b)
    done = drain(engine)
    assert done[a.key].tokens != done[b.key].tokens


def test_export_mid_generation_and_import_continues_exactly(weights):
    specs = [spec(p, max_new=14) for p in range(5)]
    reference = make_engine(weights)
    for s in specs:
        reference.add(s)
    expected = drain(reference)

    first = make_engine(weights, max_running=3)
    for s in specs:
        first.add(s)
    early = {c.spec.key: c for _ in range(4) for c in first.step()}
    exported = first.export_inflight()
    assert first.num_waiting == first.num_running == first.tokens_in_flight == 0
    assert first.step() == []
    assert len(exported) + len(early) == len(specs)
    started = [r for r in exported if r.generated]
    assert started and all(r.rng_state is not None for r in started)
    assert any(not r.generated and r.rng_state is None for r in exported)  # still queued

    second = make_engine(weights, device_index=1)
    for r in reversed(exported):  # import order does not matter
        second.add(r)
    resumed = {**early, **drain(second)}
    for s in specs:
        assert resumed[s.key].tokens == expected[s.key].tokens
        assert resumed[s.key].logprobs == expected[s.key].logprobs


def test_stops_on_eos_included_or_at_length(weights):
    probe = make_engine(weights)
    s = spec(2, max_new=10)
    probe.add(s)
    tokens = drain(probe)[s.key].tokens
    assert len(tokens) == 10
    eos = tokens[4]  # declare the 5th sampled token EOS: generation must stop there
    cut = tokens.index(eos) + 1

    engine = make_engine(weights, eos=eos)
    engine.add(s)
    done = drain(engine)[s.key]
    assert done.finish_reason == "eos"
    assert done.tokens == tokens[:cut] and done.tokens[-1] == eos
    assert len(done.logprobs) == cut

    short = make_engine(weights, eos=-1)
    short.add(spec(2, max_new=3))
    done = drain(short)[s.key]
    assert (done.finish_reason, done.tokens) == ("length", tokens[:3])


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_logprobs_match_teacher_forced_forward(weights, batch_invariant):
    engine = make_engine(weights, max_running=3, eos=-1, batch_invariant=batch_invariant)
    specs = [spec(3, max_new=12), spec(4, max_new=9, temperature=0.7),
             spec(6, max_new=5, plen=1), spec(7, max_new=7, plen=9, temperature=0.0)]
    for s in specs:
        engine.add(s)
    done = drain(engine)  # different prompt lengths: exercises padding in the batched mode
    model = make_model()
    for s in specs:
        c = done[s.key]
        assert len(c.tokens) == s.max_new_tokens
        ids = torch.tensor([[*s.prompt_tokens, *c.tokens]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double() / (s.temperature or 1.0)
        n = len(s.prompt_tokens)
        ref = torch.log_softmax(logits[n - 1:-1], dim=-1).gather(1, ids[0, n:, None])[:, 0]
        assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=1e-4)
        if s.temperature == 0:
            assert c.tokens == logits[n - 1:-1].argmax(-1).tolist()


def test_admission_never_exceeds_max_running(weights):
    engine = make_engine(weights, max_running=2, eos=-1)
    for p in range(5):
        engine.add(spec(p, max_new=2 + p))
    assert (engine.num_waiting, engine.num_running) == (5, 0)
    finished = 0
    while engine.num_waiting or engine.num_running:
        finished += len(engine.step())
        assert engine.num_running <= 2
        assert engine.num_running + engine.num_waiting + finished == 5
    assert engine.stats.num_generated_tokens == sum(2 + p for p in range(5))


def test_run_returns_when_a_request_finishes(weights):
    engine = make_engine(weights, eos=-1)
    engine.add(spec(1, max_new=2))
    engine.add(spec(2, max_new=6))
    first = engine.run(max_s=30.0)
    assert [c.spec.prompt for c in first] == [1] and engine.num_running == 1
    assert [c.spec.prompt for c in engine.run(max_s=30.0)] == [2]
    assert engine.run(max_s=30.0) == []
    assert engine.stats.num_generated_tokens == 8


def _rng_state() -> bytes:
    return torch.Generator().get_state().numpy().tobytes()


INADMISSIBLE = {
    "needs version 1": lambda: spec(1, version=1),
    "empty prompt": lambda: RequestSpec(0, 1, 0, 0, (), 4, 1),
    "2 tokens but 1 log-probs": lambda: InflightRequest(spec(1), [5, 6], [-1.0], _rng_state()),
    "no rng_state": lambda: InflightRequest(spec(1), [5], [-1.0]),
    "nothing left": lambda: InflightRequest(spec(1, max_new=2), [5, 6], [-1.0] * 2,
                                            _rng_state()),
    "token id 32 is outside": lambda: RequestSpec(0, 1, 0, 0, (3, 32, 4), 4, 1),
    "temperature": lambda: spec(1, temperature=-1.0),
}


@pytest.mark.parametrize("why", list(INADMISSIBLE))
def test_add_refuses_a_request_that_could_not_run_and_queues_nothing(weights, why):
    engine = make_engine(weights)
    with pytest.raises(ValueError, match=r"request \(0, 1, 0\)") as refused:
        engine.add(INADMISSIBLE[why]())
    assert why in str(refused.value)
    assert engine.num_waiting == 0  # nothing bad entered the queue: the engine still serves
    engine.add(spec(2, max_new=3))
    assert [c.spec.prompt for c in drain(engine).values()] == [2]


def test_requests_come_after_their_version_loads(weights):
    engine = make_engine(weights)
    engine.add(spec(1))  # queued at version 0: a load may not leave it stale in the queue
    with pytest.raises(RuntimeError, match="cannot load version 1 while 1 requests"):
        engine.load_weights(weights, version=1)
    assert engine.export_inflight()[0].spec.key == spec(1).key
    engine.load_weights(weights, version=1)
    engine.add(spec(2, version=1, max_new=2))
    done = drain(engine)
    assert {c.engine_version for c in done.values()} == {1} and len(done) == 1


def test_a_request_failing_admission_leaves_the_queue_and_the_others_run(weights, monkeypatch):
    engine = make_engine(weights, max_running=2)
    for p in range(4):
        engine.add(spec(p, max_new=3))
    admit = engine._admit

    def broken(item):  # what add cannot foresee (the model's forward fails on this context)
        if item.spec.prompt == 1:
            raise RuntimeError("forward failed")
        return admit(item)

    monkeypatch.setattr(engine, "_admit", broken)
    with pytest.raises(RuntimeError, match="forward failed") as failed:
        engine.step()
    assert any("request (0, 1, 0)" in note and "left the queue" in note
               for note in failed.value.__notes__)
    assert engine.num_running + engine.num_waiting == 3  # not wedged: only it is gone
    assert sorted(c.spec.prompt for c in drain(engine).values()) == [0, 2, 3]


def test_a_context_past_the_model_positions_is_refused_at_add(weights):
    engine = make_engine(weights)  # max_position_embeddings = 256
    fits = spec(3, plen=6, max_new=250)  # 6 prompt tokens: prompt + max_new_tokens = 256
    assert len(fits.prompt_tokens) == 6
    engine.add(fits)
    too_long = spec(3, sample=1, plen=6, max_new=251)
    with pytest.raises(ValueError, match=r"request \(0, 3, 1\): 6 prompt tokens \+ 251 "
                                         r"max_new_tokens = 257 .*max_position_embeddings 256"):
        engine.add(too_long)
    migrated = InflightRequest(too_long, [5] * 3, [-1.0] * 3, _rng_state())
    with pytest.raises(ValueError, match=r"\(3 generated\).*max_position_embeddings 256"):
        engine.add(migrated)
    assert engine.num_waiting == 1  # only the request that fits was queued


def test_load_weights_is_strict_and_in_place(weights):
    engine = make_engine(weights)
    param = next(engine.model.parameters())
    engine.load_weights({k: v * 0 for k, v in weights.items()}, version=2)
    assert engine.version == 2 and param.abs().sum() == 0
    assert not any(p.requires_grad for p in engine.model.parameters())
    with pytest.raises(RuntimeError):
        engine.load_weights({"nope": torch.zeros(1)}, version=3)
    engine.load_weights(weights, version=0)
    engine.add(spec(1))
    engine.step()
    with pytest.raises(RuntimeError, match="while"):
        engine.load_weights(weights, version=1)


def test_migrated_request_keeps_its_prefix(weights):
    s = spec(5, max_new=6)
    engine = make_engine(weights)
    engine.add(InflightRequest(spec=s))
    engine.step()
    engine.step()
    (r,) = engine.export_inflight()
    assert len(r.generated) == len(r.logprobs) == 2
    other = make_engine(weights)
    other.add(r)
    done = drain(other)[s.key]
    assert done.tokens[:2] == r.generated and len(done.tokens) == 6
    assert other.stats.num_prefill_tokens == len(s.prompt_tokens) + 1


def test_whole_prompt_prefill_is_batch_invariant_and_migrates_exactly(weights):
    def engine(**kw):
        e = RolloutEngine(make_model(seed=123), eos_token_id=EOS, whole_prompt_prefill=True,
                          **{"device_index": 0, **kw})
        e.load_weights(weights, version=0)
        return e

    specs = [spec(p, max_new=14, plen=9) for p in range(5)]
    alone = {}
    for s in specs:
        single = engine()
        single.add(s)
        alone.update(drain(single))
    first = engine(max_running=3)
    for s in specs:
        first.add(s)
    early = {c.spec.key: c for _ in range(4) for c in first.step()}
    exported = first.export_inflight()
    assert any(r.generated for r in exported)
    second = engine(device_index=1, max_running=2)
    for r in exported:
        second.add(r)
    resumed = {**early, **drain(second)}
    for s in specs:
        assert resumed[s.key].tokens == alone[s.key].tokens
        assert resumed[s.key].logprobs == alone[s.key].logprobs


def test_add_all_queues_every_request_or_none(weights):
    """A batch with one request that could not run is refused whole: nothing of it is
    queued (a device's `submit`), so the caller's retry elsewhere cannot serve any twice."""
    engine = make_engine(weights)
    with pytest.raises(ValueError, match=r"request \(0, 1, 0\)"):
        engine.add_all([spec(2, max_new=3), spec(3, max_new=3), spec(1, temperature=-1.0)])
    assert engine.num_waiting == 0
    engine.add_all([spec(2, max_new=3), spec(3, max_new=3)])
    assert engine.num_waiting == 2
    assert sorted(c.spec.prompt for c in drain(engine).values()) == [2, 3]
