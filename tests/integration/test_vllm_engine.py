"""The vLLM rollout engine in this process (no Ray): exact seeded sampling across repeats,
migration by resubmission, a request running alone, log-probs against transformers, in-place
weight reload and the version check. Skipped without vLLM (`bash scripts/setup.sh
--with-vllm`; CI installs it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from vllm_tiny import EOS, tiny_model  # noqa: E402
from vllm_tiny import run_all as serve_all  # noqa: E402

from dynaresize.core.types import RequestSpec, request_seed  # noqa: E402


def run_all(engine: Any, items: list[Any]) -> dict[tuple[int, int, int], Any]:
    """`vllm_tiny.run_all` within this module's 120 s (small requests)."""
    return serve_all(engine, items, 120.0)


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model()


@pytest.fixture(scope="module")
def engine(model: Any) -> Iterator[Any]:
    from dynaresize.rollout.vllm_engine import VllmRolloutEngine
    from dynaresize.rollout.vllm_world import model_dir

    eng = VllmRolloutEngine(model_dir(model), eos_token_id=EOS, device_index=3, max_running=8,
                            kv_cache_bytes=32 * 2**20)
    yield eng
    eng.shutdown()


def specs(num: int, version: int = 0, max_new: int = 24) -> list[RequestSpec]:
    return [RequestSpec(0, i // 2, i % 2, version, tuple(range(3, 5 + i % 4)), max_new,
                        request_seed(5, 0, i // 2, i % 2), temperature=1.0 + 0.25 * (i % 2))
            for i in range(num)]


def test_repeat_and_migration_give_the_same_tokens(engine: Any) -> None:
    first = run_all(engine, specs(6))
    assert len(first) == 6 and {c.device for c in first.values()} == {3}
    again = run_all(engine, specs(6))
    assert {k: c.tokens for k, c in again.items()} == {k: c.tokens for k, c in first.items()}
    for item in specs(6):
        engine.add(item)
    finished = []
    for _ in range(6):
        finished += engine.step()
    moved = engine.export_inflight()
    assert moved and all(0 < len(m.generated) == len(m.logprobs) for m in moved)
    assert engine.num_running == 0
    migrated = run_all(engine, list(reversed(moved)))  # another order, other batch slots
    migrated.update({c.spec.key: c for c in finished})
    for key, c in first.items():
        assert migrated[key].tokens == c.tokens
        assert migrated[key].logprobs == pytest.approx(c.logprobs, abs=1e-5)
        assert c.finish_reason == ("eos" if c.tokens[-1] == EOS else "length")


def test_a_request_alone_matches_it_in_a_batch(engine: Any) -> None:
    batch = run_all(engine, specs(4))
    for item in specs(4):
        alone = run_all(engine, [item])[item.key]
        assert alone.tokens == batch[item.key].tokens


def test_logprobs_are_those_of_the_model_at_the_temperature(engine: Any, model: Any) -> None:
    for key, c in run_all(engine, specs(4)).items():
        spec = next(s for s in specs(4) if s.key == key)
        ids = torch.tensor([[*spec.prompt_tokens, *c.tokens]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double() / spec.temperature
        ref = torch.log_softmax(logits, -1)
        start = len(spec.prompt_tokens) - 1
        expected = [float(ref[start + j, t]) for j, t in enumerate(c.tokens)]
        assert c.logprobs == pytest.approx(expected, abs=1e-4)


def test_weight_reload_in_place_and_version_check(engine: Any, model: Any) -> None:
    before = run_all(engine, specs(4))
    engine.add(specs(1)[0])
    engine.step()
    shifted = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="cannot load version 1"):
        engine.load_weights(shifted, 1)
    engine.export_inflight()
    engine.load_weights(shifted, 1)
    assert engine.version == 1
    with pytest.raises(ValueError, match="needs version 0"):
        run_all(engine, specs(1))
    engine.export_inflight()
    after = run_all(engine, specs(4, version=1))
    assert any(after[k].tokens != before[k].tokens for k in before)
    engine.release_kv()
    engine.alloc_kv()
    engine.load_weights(model.state_dict(), 0)
    restored = run_all(engine, specs(4))
    assert {k: c.tokens for k, c in restored.items()} == {k: c.tokens for k, c in before.items()}


def test_add_refuses_a_request_that_could_not_run(engine: Any) -> None:
    from vllm_tiny import VOCAB

    v, limit = engine.version, engine.max_model_len
    with pytest.raises(ValueError, match=f"11 max_new_tokens = {limit + 1} .*max_model_len"):
        engine.add(RequestSpec(0, 9, 0, v, (3,) * (limit - 10), 11, 1))
    with pytest.raises(ValueError, match=f"token id {VOCAB} is outside"):
        engine.add(RequestSpec(0, 9, 0, v, (3, VOCAB), 4, 1))
    with pytest.raises(ValueError, match="needs version"):
        engine.add(RequestSpec(0, 9, 0, v + 1, (3, 4), 4, 1))
    assert engine.num_waiting == 0
    assert len(run_all(engine, specs(2))) == 2  # nothing bad was queued: it still serves


def test_only_the_runs_eos_ends_a_request(engine: Any) -> None:
    """A checkpoint's generation_config.json may list more EOS ids (Qwen2.5-, Llama-3-Instruct
    list two); vLLM used to stop at those too, cutting responses the builtin engine goes on
    with and labelling them 'length'."""
    from dynaresize.rollout.vllm_engine import VllmRolloutEngine
    from dynaresize.rollout.vllm_world import model_dir

    items = specs(6)
    ref = run_all(engine, items)
    other = next(t for c in ref.values() for t in c.tokens[:-1] if t != EOS)
    template = tiny_model()
    template.generation_config.eos_token_id = [EOS, other]
    two_eos = VllmRolloutEngine(model_dir(template), eos_token_id=EOS, device_index=4,
                                max_running=8, kv_cache_bytes=32 * 2**20)
    try:
        got = run_all(two_eos, items)
    finally:
        two_eos.shutdown()
    assert {k: (c.tokens, c.finish_reason) for k, c in got.items()} == \
        {k: (c.tokens, c.finish_reason) for k, c in ref.items()}


def test_a_start_failing_after_vllm_started_frees_it_without_vllms_teardown(
        model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure after `LLM(...)` (the warm-up, the drafting hook) frees the engine by our own
    `shutdown`, with vLLM's finaliser detached first: its teardown would destroy the device
    process's torch.distributed groups when the half-built engine is collected."""
    from dynaresize.rollout.vllm_engine import VllmRolloutEngine
    from dynaresize.rollout.vllm_world import model_dir

    built: list[Any] = []
    shut: list[Any] = []
    real_shutdown = VllmRolloutEngine.shutdown

    def failing_warm_up(self: Any) -> None:
        built.append(self.engine.engine_core)
        raise RuntimeError("warm-up failed")

    def recording_shutdown(self: Any) -> None:
        shut.append(self)
        real_shutdown(self)

    monkeypatch.setattr(VllmRolloutEngine, "_warm_up", failing_warm_up)
    monkeypatch.setattr(VllmRolloutEngine, "shutdown", recording_shutdown)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        VllmRolloutEngine(model_dir(model), eos_token_id=EOS, device_index=5, max_running=4,
                          kv_cache_bytes=32 * 2**20)
    assert len(shut) == 1 and shut[0].engine is None
    finalizer = getattr(built[0], "_finalizer", None)
    assert finalizer is None or not finalizer.alive
