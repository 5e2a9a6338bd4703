"""Exact speculative decoding on the vLLM engine (`rollout.vllm_speculative`), in this process
(no Ray): the same tokens with speculation on and off, in a batch, alone, after a migration
mid-request and after a weight reload; drafts are proposed and accepted, and save forwards.
Skipped without vLLM (`bash scripts/setup.sh --with-vllm`; CI installs it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from vllm_tiny import run_all, tiny_model  # noqa: E402

from dynaresize.core.types import RequestSpec, request_seed  # noqa: E402
from dynaresize.rollout.speculative import SpeculationSettings  # noqa: E402


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model()


@pytest.fixture(scope="module", params=[False, True], ids=["token-drafts", "coupled-drafts"])
def engines(model: Any, request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """(speculation off, on): on drafts tokens only, or also coupled drafts (`coupled`)."""
    from dynaresize.rollout.vllm_engine import VllmRolloutEngine
    from dynaresize.rollout.vllm_world import model_dir

    path = model_dir(model)
    settings = SpeculationSettings(max_draft_tokens=4, min_ngram=1, max_ngram=3,
                                   coupled=request.param)
    made = [VllmRolloutEngine(path, eos_token_id=None, device_index=i, max_running=8,
                              kv_cache_bytes=32 * 2**20, speculation=s)
            for i, s in enumerate((None, settings))]
    yield made[0], made[1]
    for eng in made:
        eng.shutdown()


def specs(num: int, version: int = 0, max_new: int = 64) -> list[RequestSpec]:
    """GRPO groups of 2 (siblings share a prompt) at a low and a moderate temperature: a random
    model then repeats itself, so the drafters find drafts that are accepted."""
    return [RequestSpec(0, i // 2, i % 2, version, tuple(range(3, 5 + i % 4)) * 2, max_new,
                        request_seed(11, 0, i // 2, i % 2), temperature=0.05 + 0.6 * (i % 2))
            for i in range(num)]


def same(a: dict[Any, Any], b: dict[Any, Any]) -> None:
    assert a.keys() == b.keys()
    for key, c in a.items():
        assert b[key].tokens == c.tokens, key
        assert b[key].logprobs == pytest.approx(c.logprobs, abs=1e-5)


def test_speculation_gives_the_tokens_of_plain_decoding(engines: tuple[Any, Any]) -> None:
    off, on = engines
    plain = run_all(off, specs(6))
    spec = run_all(on, specs(6))
    same(plain, spec)
    stats = on.speculation.stats
    assert stats.num_verify_iterations > 0 and stats.num_accepted_tokens > 0
    store = on.drafting.store  # coupled: every verified row's distribution was stored
    assert (store is not None and store.size > 0) == on.drafting.speculation.settings.coupled
    assert sum(stats.accepted_histogram.values()) == stats.num_verify_iterations
    forwards = [eng.stats.num_decode_iterations for eng in engines]
    alone = {eng: run_all(eng, specs(1)) for eng in engines}  # one request, and a companion
    same({k: plain[k] for k in alone[on]}, alone[on])
    same(alone[off], alone[on])
    used = [eng.stats.num_decode_iterations - n for eng, n in zip(engines, forwards)]
    assert used[1] < used[0]  # accepted drafts: fewer forwards for the same tokens


def test_migration_mid_request_and_history_drafts(engines: tuple[Any, Any]) -> None:
    off, on = engines
    plain = run_all(off, specs(6))
    for item in specs(6):
        on.add(item)
    finished = []
    for _ in range(5):
        finished += on.step()
    moved = on.export_inflight()
    assert moved and all(0 < len(m.generated) == len(m.logprobs) for m in moved)
    migrated = run_all(on, list(reversed(moved)))
    migrated.update({c.spec.key: c for c in finished})
    same(plain, migrated)


def test_weight_reload_keeps_them_equal(engines: tuple[Any, Any], model: Any) -> None:
    off, on = engines
    shifted = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    for eng in engines:
        eng.load_weights(shifted, 1)
    same(run_all(off, specs(4, version=1)), run_all(on, specs(4, version=1)))
    for eng in engines:
        eng.load_weights(model.state_dict(), 0)
