"""The evaluation worker's memory cuts change no result: the received weights become the
parameters (no second copy, tied weights stay tied), nothing is held between evaluations, and
version 0 after a release rebuilds the same model (in-process, a tiny local checkpoint)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_checkpoint import tiny_arithmetic_config  # noqa: E402

pytest.importorskip("reasoning_gym")


def _worker(tmp_path: Path) -> Any:
    from dynaresize.evaluation.worker import EvalWorker

    return EvalWorker(tiny_arithmetic_config(tmp_path, 6).to_dict())


def _template(worker: Any) -> Any:
    """A fresh version-0 model, built like the worker builds its own."""
    from dynaresize.models import build_model

    tok = worker.task.tokenizer
    return build_model(worker.cfg.model, tok.vocab_size, eos_token_id=tok.eos_id,
                       bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)


def _perturbed(worker: Any) -> dict[str, Any]:
    """Version-1 weights: the template's, shifted; tied weights one tensor under both keys
    (as a trainer publishes them)."""
    import torch

    model = _template(worker)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.01 * (i + 1))
    return model.state_dict()


def _reference(worker: Any, state_dict: dict[str, Any] | None) -> list[list[int]]:
    """Responses the way the worker evaluated before its memory cuts: a separate model with
    the weights copied in."""
    import torch

    from dynaresize.evaluation.worker import greedy_generate

    model = _template(worker)
    if state_dict is not None:
        with torch.no_grad():
            model.load_state_dict(state_dict, strict=True)
    tok = worker.task.tokenizer
    return greedy_generate(model, [tuple(p.tokens) for p in worker.prompts],
                           worker.cfg.task.max_new_tokens, tok.eos_id, tok.pad_id)


def _scores(worker: Any, responses: list[list[int]]) -> dict[str, Any]:
    """What `evaluate` reports of these responses (eval_s aside)."""
    from dynaresize.evaluation import score_responses
    from dynaresize.evaluation.worker import NUM_EXAMPLES

    rewards = [worker.task.reward(p, r) for p, r in zip(worker.prompts, responses, strict=True)]
    return {**score_responses(rewards), "examples": [
        {"answer": p.answer, "response": worker.task.response_text(r), "reward": round(x, 4)}
        for p, r, x in zip(worker.prompts[:NUM_EXAMPLES], responses, rewards)]}


def _reported(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "eval_s"}


def test_assigned_weights_give_the_copied_results_and_nothing_is_held(tmp_path: Path) -> None:
    worker = _worker(tmp_path)
    weights = _perturbed(worker)
    want0, want1 = _reference(worker, None), _reference(worker, weights)
    assert want0 != want1  # the two versions answer differently: the check has teeth

    first = worker.evaluate(0, None)
    assert all(p.is_meta for p in worker.model.parameters())  # nothing held in between
    assert worker.version is None
    assert _reported(first) == _scores(worker, want0)

    worker.load_version(1, weights)
    emb = worker.model.get_input_embeddings().weight
    assert worker.model.get_output_embeddings().weight.data_ptr() == emb.data_ptr()
    assert emb.data_ptr() == weights["model.embed_tokens.weight"].data_ptr()  # no copy
    worker.release_weights()

    second = worker.evaluate(1, weights)
    assert _reported(second) == _scores(worker, want1)
    again = worker.evaluate(0, None)  # version 0 after a release: rebuilt from the template
    assert again["examples"] == first["examples"]
    with pytest.raises(ValueError, match="version 2 got no weights"):
        worker.evaluate(2, None)
