"""Exact speculative decoding, live: SmolLM2-135M on a chain-of-thought task, the builtin engine
with speculation off and on side by side in one process (one torch thread, as one CPU device).

Three engines over the same weights serve the same requests, one request at a time (a lightly
loaded engine, as in the rollout's tail), in turns: `base` (one-token forwards, today's default),
`off` (fixed-row forwards, speculation off) and `on` (the same forwards, speculation on), one
engine iteration of each in turn, so that all three see the same load. The
requests of a prompt run one after another, so later samples see their finished siblings' text
(the drafter's situation in the tail). Reported: tokens/s per engine over every request and over
the longest quarter (the tail), accepted draft tokens per verify iteration, and whether `on`
produced exactly `off`'s tokens and log-probs. Writes its block into docs/results.md
(`--write-results`) and the acceptance histograms into docs/data/spec_acceptance.json: accepted
drafts per verify iteration (`accepted_histogram`) and accepted tokens per iteration of a
speculating request (`accepted_per_iteration`, which the twin calibrates from: an iteration
that found no draft counts as 1 token, one that accepted a drafts as 1 + a).

    python bench/speculative.py --prompts 2 --samples 3 --max-new-tokens 256 --write-results

`--histogram-only` adds `accepted_per_iteration` to an existing spec_acceptance.json written
before the field existed, from its own counts: the `on` engine's forwards are
accepted_tokens / (tokens_per_forward["on"] - 1), since each forward gives one token plus its
accepted drafts (exact for the file's counts; no rerun).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path
from typing import Any

START, END = "<!-- bench-speculative:start -->", "<!-- bench-speculative:end -->"
ROOT = Path(__file__).resolve().parents[1]
TASK = ["task.name='reasoning_gym'", "task.generator='gsm_symbolic'", "task.format='chat'",
        "model.source='smollm2-135m'"]


def _engines(cfg: Any, rows: int, settings: Any) -> dict[str, Any]:
    from dynaresize.models import build_model
    from dynaresize.rollout.engine import RolloutEngine
    from dynaresize.tasks import make_task

    tok = make_task(cfg).tokenizer
    model = build_model(cfg.model, tok.vocab_size, eos_token_id=tok.eos_id,
                        bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)

    def make(forward_rows: int, speculation: Any) -> Any:
        return RolloutEngine(copy.deepcopy(model), eos_token_id=tok.eos_id, device_index=0,
                             max_running=1, forward_rows=forward_rows, speculation=speculation,
                             whole_prompt_prefill=True)

    return {"base": make(0, None), "off": make(rows, None), "on": make(rows, settings)}


def _serve(engines: dict[str, Any], spec: Any) -> dict[str, tuple[Any, float, int]]:
    """Serve `spec` on every engine, one engine iteration of each in turn (so all of them see
    the same load of the shared machine); per engine: completion, seconds, forwards."""
    out: dict[str, tuple[Any, float, int]] = {}
    busy = {name: 0.0 for name in engines}
    forwards = dict.fromkeys(engines, 0)
    for engine in engines.values():
        engine.add(spec)
    while len(out) < len(engines):
        for name, engine in engines.items():
            if name in out:
                continue
            t0 = time.perf_counter()
            done = engine.step()
            busy[name] += time.perf_counter() - t0
            forwards[name] += 1
            if done:
                out[name] = (done[0], busy[name], forwards[name])
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from dynaresize.config import load_config
    from dynaresize.core.types import RequestSpec, request_seed
    from dynaresize.rollout.speculative import settings_from_config
    from dynaresize.tasks import make_task

    torch.set_num_threads(1)
    cfg = load_config(None, [*TASK, f"task.max_new_tokens={args.max_new_tokens}",
                             f"rollout.temperature={args.temperature}",
                             "rollout.speculative.enabled=true",
                             f"rollout.speculative.forward_rows={args.rows}",
                             f"rollout.speculative.max_draft_tokens={args.rows - 1}"])
    settings = settings_from_config(cfg.rollout.speculative)
    engines = _engines(cfg, args.rows, settings)
    prompts = make_task(cfg).batch(0, args.prompts, cfg.run.seed)
    rows = []
    for p in prompts:
        for s in range(args.samples):
            spec = RequestSpec(0, p.id, s, 0, p.tokens, args.max_new_tokens,
                               request_seed(cfg.run.seed, 0, p.id, s), args.temperature)
            out = _serve(engines, spec)
            exact = (out["on"][0].tokens == out["off"][0].tokens
                     and out["on"][0].logprobs == out["off"][0].logprobs)
            rows.append({"prompt": p.id, "sample": s, "tokens": len(out["off"][0].tokens),
                         "exact": exact, **{f"{n}_s": o[1] for n, o in out.items()},
                         **{f"{n}_forwards": o[2] for n, o in out.items()},
                         **{f"{n}_tokens": len(o[0].tokens) for n, o in out.items()}})
            print(f"prompt {p.id} sample {s}: {rows[-1]}", flush=True)
    return _summarise(rows, engines["on"].speculation.stats, args)


def _rate(rows: list[dict[str, Any]], name: str) -> float:
    """Tokens per second of engine `name` (`base` rounds differently: its own token counts)."""
    return sum(r[f"{name}_tokens"] for r in rows) / sum(r[f"{name}_s"] for r in rows)


def _per_forward(rows: list[dict[str, Any]], name: str) -> float:
    return sum(r[f"{name}_tokens"] for r in rows) / sum(r[f"{name}_forwards"] for r in rows)


def per_iteration(accepted_histogram: dict[int, int], num_verify: int, num_forwards: int
                  ) -> dict[int, int]:
    """Accepted tokens per iteration (1 + accepted drafts) over every forward of a request:
    the `num_forwards - num_verify` forwards without a draft give 1 token each."""
    plain = num_forwards - num_verify
    if plain < 0 or sum(accepted_histogram.values()) != num_verify:
        raise ValueError(f"{num_forwards} forwards, {num_verify} verify iterations, histogram "
                         f"{accepted_histogram}: inconsistent counts")
    out = {a + 1: n for a, n in sorted(accepted_histogram.items())}
    out[1] = out.get(1, 0) + plain
    return dict(sorted(out.items()))


def add_histogram(data: dict[str, Any]) -> dict[str, Any]:
    """`--histogram-only`: `accepted_per_iteration` from a file's own counts (module doc)."""
    extra = data["tokens_per_forward"]["on"] - 1.0
    forwards = round(data["accepted_tokens"] / extra) if extra > 0 else data["verify_iterations"]
    hist = {int(k): v for k, v in data["accepted_histogram"].items()}
    return {**data, "forwards_on": forwards,
            "accepted_per_iteration": per_iteration(hist, data["verify_iterations"], forwards)}


def _summarise(rows: list[dict[str, Any]], stats: Any, args: argparse.Namespace
               ) -> dict[str, Any]:
    tail = sorted(rows, key=lambda r: r["tokens"])[-max(1, len(rows) // 4):]
    hist = {int(k): v for k, v in sorted(stats.accepted_histogram.items())}
    iters = stats.num_verify_iterations
    return {
        "model": "smollm2-135m", "task": "reasoning_gym gsm_symbolic, chat",
        "temperature": args.temperature, "forward_rows": args.rows,
        "max_draft_tokens": args.rows - 1, "max_new_tokens": args.max_new_tokens,
        "requests": len(rows), "tail_requests": len(tail),
        "all_exact": all(r["exact"] for r in rows),
        "tokens_per_s": {n: _rate(rows, n) for n in ("base", "off", "on")},
        "tail_tokens_per_s": {n: _rate(tail, n) for n in ("base", "off", "on")},
        "tokens_per_forward": {n: _per_forward(rows, n) for n in ("base", "off", "on")},
        "tail_tokens_per_forward": {n: _per_forward(tail, n) for n in ("base", "off", "on")},
        "accepted_histogram": hist,
        "forwards_on": sum(r["on_forwards"] for r in rows),
        "accepted_per_iteration": per_iteration(hist, iters,
                                                sum(r["on_forwards"] for r in rows)),
        "verify_iterations": iters,
        "mean_accepted_per_verify": stats.num_accepted_tokens / iters if iters else 0.0,
        "draft_tokens": stats.num_draft_tokens, "accepted_tokens": stats.num_accepted_tokens,
        "rows": rows,
    }


def format_block(r: dict[str, Any]) -> str:
    t, tt = r["tokens_per_s"], r["tail_tokens_per_s"]
    return "\n".join([
        START,
        f"`python bench/speculative.py` ({r['model']}, {r['task']}, temperature "
        f"{r['temperature']}, {r['requests']} requests of up to {r['max_new_tokens']} tokens, "
        f"one at a time on one torch thread; forward_rows {r['forward_rows']}, up to "
        f"{r['max_draft_tokens']} drafts; shared 2-core machine, ratios side by side):",
        "",
        "| engine | tokens/s, all | tokens/s, tail (longest quarter) |",
        "|---|---:|---:|",
        f"| one-token forwards (default) | {t['base']:.2f} | {tt['base']:.2f} |",
        f"| fixed-row forwards, speculation off | {t['off']:.2f} | {tt['off']:.2f} |",
        f"| fixed-row forwards, speculation on | {t['on']:.2f} | {tt['on']:.2f} |",
        "",
        f"Tokens per forward (the speed-up free of the machine's load; a forward costs the "
        f"same with and without drafts): on {r['tokens_per_forward']['on']:.2f}, tail "
        f"{r['tail_tokens_per_forward']['on']:.2f}.",
        "",
        f"Speculation on / off: **{t['on'] / t['off']:.2f}x** over all requests, "
        f"**{tt['on'] / tt['off']:.2f}x** on the tail; against the default one-token forwards "
        f"{t['on'] / t['base']:.2f}x and {tt['on'] / tt['base']:.2f}x. Fixed rows alone cost "
        f"{t['base'] / t['off']:.2f}x. Tokens and log-probs identical on and off: "
        f"{'yes' if r['all_exact'] else 'NO'}. Accepted drafts per verify iteration: mean "
        f"{r['mean_accepted_per_verify']:.2f} over {r['verify_iterations']} iterations "
        f"(histogram in docs/data/spec_acceptance.json).",
        END])


def write_block(block: str, path: Path = ROOT / "docs" / "results.md") -> None:
    text = path.read_text(encoding="utf-8")
    if START in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Exact speculative decoding (live)\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--histogram-only", action="store_true",
                        help="add accepted_per_iteration to docs/data/spec_acceptance.json "
                             "from its own counts (no run)")
    args = parser.parse_args()
    if args.histogram_only:
        path = ROOT / "docs" / "data" / "spec_acceptance.json"
        data = add_histogram(json.loads(path.read_text(encoding="utf-8")))
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(data["accepted_per_iteration"])
        return
    result = run(args)
    block = format_block(result)
    print(block)
    if args.write_results:
        write_block(block)
        data = {k: v for k, v in result.items() if k != "rows"}
        out = ROOT / "docs" / "data" / "spec_acceptance.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
