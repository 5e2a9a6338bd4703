"""What the in-process vLLM engine tests share: the tiny model vLLM can serve (head size 32,
`model.num_heads=2`) and serving a list of requests to the end (no vLLM import here)."""

from __future__ import annotations

from typing import Any

from dynaresize.config import load_config
from dynaresize.models import build_model

VOCAB, EOS = 64, 1


def tiny_model() -> Any:
    cfg = load_config(None, ["model.num_heads=2"])
    return build_model(cfg.model, VOCAB, eos_token_id=EOS, bos_token_id=0, pad_token_id=2)


def run_all(engine: Any, items: list[Any], max_s: float = 300.0
            ) -> dict[tuple[int, int, int], Any]:
    """Serve `items` on `engine` until it is empty; the completions by request key."""
    for item in items:
        engine.add(item)
    done = engine.run(max_s, until_empty=True)
    assert engine.num_running == 0 and engine.num_waiting == 0
    return {c.spec.key: c for c in done}
