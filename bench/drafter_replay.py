"""The drafters' settings, replayed offline on real responses: tokens per forward of exact
speculative decoding for each setting, without a model forward per setting.

Verification is by equality with the token the sampler draws (docs/speculative.md), and that
token does not depend on the drafts, so how many drafts a forward accepts is a function of the
response's tokens alone. This bench generates responses once (SmolLM2-135M on vLLM, speculation
off, the chain-of-thought task of bench/speculative_vllm.py; cached in `--cache`), then serves
them again through `rollout.speculative.Speculation` for every setting of the grid: each
verify iteration drafts with the full budget (a lightly loaded engine, as in the tail), keeps
the drafts up to the first that differs from the response, and emits one more token; the
forward that reads the prompt drafts nothing (as on vLLM; the builtin engine may draft the
first token too). A GRPO group's samples are served one after another (later samples see
their finished siblings) and every prompt for `--rounds` steps (the history drafter sees
earlier steps), as in bench/speculative_vllm.py. On that bench's own 24 requests (3 prompts x
4 samples x 2 steps, a subset of the default) the replay gives the tokens per forward it
measured live to within 0.006 at both temperatures and both n-gram ranges measured
(docs/speculative.md); more siblings and history (the default 4 x 8 x 3) accept more.

`--coupled` adds rows for coupled drafts (`rollout.coupled`, vLLM's default): one
transformers forward per response gives the target's top log-probs at every position, which
the replay stores as the live engine does for the rows a verify forward keeps (the live engine
also stores the rows after a rejected draft, which a replay of the response cannot know: live
accepts more).

    python bench/drafter_replay.py --temperature 0.6 --write-results
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from policies import block_markers, write_block  # bench/policies.py: results blocks
from spec_warm import request_specs  # bench/spec_warm.py
from speculative_vllm import MAX_RUNNING, TASK, _engines, _serve  # bench/speculative_vllm.py

ROOT = Path(__file__).resolve().parents[1]
ALL = "prefix,siblings,history"
COUPLED = [(7, 1, 4, ALL), (16, 1, 4, ALL), (7, 2, 4, ALL), (7, 1, 6, ALL)]
"""Settings replayed with coupled drafts too (`--coupled`)."""
GRID = [(7, 2, 4, ALL), (7, 1, 4, ALL), (7, 3, 4, ALL), (7, 1, 6, ALL), (16, 2, 4, ALL),
        (16, 1, 4, ALL), (16, 1, 6, ALL), (7, 1, 4, "prefix"), (7, 1, 4, "prefix,siblings"),
        (7, 1, 4, "prefix,history"), (7, 1, 4, "siblings,history")]
"""(max_draft_tokens, min_ngram, max_ngram, drafters) settings replayed."""


def markers(temperature: float) -> tuple[str, str]:
    return block_markers(f"drafter-replay-t{temperature:g}")


def generate(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Responses (tokens) of `--prompts` x `--samples` x `--rounds` requests, speculation off."""
    from dynaresize.config import load_config
    from dynaresize.tasks import make_task

    cfg = load_config(None, [*TASK, f"task.max_new_tokens={args.max_new_tokens}",
                             "rollout.engine='vllm'"])
    prompts = make_task(cfg).batch(0, args.prompts, cfg.run.seed)
    max_len = max(len(p.tokens) for p in prompts) + args.max_new_tokens + 8
    engine = _engines(cfg, max_len, {"off": None})["off"]
    rows: list[dict[str, Any]] = []
    for step in range(args.rounds):
        specs = request_specs(step, prompts, range(args.samples), args.max_new_tokens,
                              args.temperature, cfg.run.seed)
        for first in range(0, len(specs), MAX_RUNNING):
            batch = specs[first:first + MAX_RUNNING]
            out = _serve({"off": engine}, batch)["off"]
            rows += [{"step": s.step, "prompt": s.prompt, "sample": s.sample,
                      "prompt_tokens": list(s.prompt_tokens),
                      "tokens": list(out[s.key]["completion"].tokens)}
                     for s in batch]
        print(f"generated step {step}: {len(rows)} responses", flush=True)
    engine.shutdown()
    return rows


def top_logprobs_of(rows: list[dict[str, Any]]) -> list[Any]:
    """Per response, the target's top log-probs after each of its contexts (row `i`: after the
    prompt and `i` generated tokens), from one transformers forward (fp32) each."""
    import torch
    from transformers import AutoModelForCausalLM

    from dynaresize.config import load_config
    from dynaresize.model_sources import ensure_source
    from dynaresize.rollout.coupled import top_logprobs

    cfg = load_config(None, [*TASK])
    model = AutoModelForCausalLM.from_pretrained(ensure_source(cfg.model.source),
                                                 dtype=torch.float32).eval()
    tops = []
    for r in rows:
        ids = torch.tensor([[*r["prompt_tokens"], *r["tokens"]]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r["prompt_tokens"]) - 1:]
        tops.append(top_logprobs(logits))
    return tops


def replay(rows: list[dict[str, Any]], max_draft_tokens: int, min_ngram: int,
           max_ngram: int, drafters: str, max_new_tokens: int, temperature: float = 1.0,
           tops: list[Any] | None = None) -> dict[str, float]:
    """Tokens per forward (and over the longest quarter) of `rows` served one at a time;
    `tops` (`top_logprobs_of`): coupled drafts first, token drafts where they give none."""
    from dynaresize.core.types import request_seed
    from dynaresize.rollout.coupled import DistributionStore, coupled_drafts
    from dynaresize.rollout.speculative import Speculation, SpeculationSettings

    spec = Speculation(SpeculationSettings(max_draft_tokens=max_draft_tokens,
                                           drafters=tuple(drafters.split(",")),
                                           min_ngram=min_ngram, max_ngram=max_ngram))
    store = DistributionStore(min_ngram, max_ngram)
    run_seed = load_seed()
    forwards: list[tuple[int, int]] = []
    for i in sorted(range(len(rows)), key=lambda i: (rows[i]["step"], rows[i]["prompt"],
                                                     rows[i]["sample"])):
        r = rows[i]
        key, tokens = (r["step"], r["prompt"], r["sample"]), r["tokens"]
        prompt = tuple(r["prompt_tokens"])
        seed = request_seed(run_seed, *key)
        spec.pool.start(key, prompt, [])
        context = list(prompt)
        done = num_forwards = 0
        while done < len(tokens):
            # vLLM drafts nothing on the forward that reads the prompt (its first token)
            budget = spec.budget(key, num_generated=done, max_new_tokens=max_new_tokens,
                                 num_running=1) if done else 0
            drafts = [] if tops is None or not budget else coupled_drafts(
                store, prompt, context, seed=seed, first_t=done, temperature=temperature,
                limit=budget)
            drafts = drafts or spec.pool.propose(key, budget)
            kept = next((k for k, d in enumerate(drafts)
                         if done + k >= len(tokens) or tokens[done + k] != d), len(drafts))
            emitted = tokens[done:done + kept + 1]
            if tops is not None:  # the rows this forward kept, each after its context
                ids, logprobs = tops[i]
                for j in range(len(emitted)):
                    store.observe(prompt, [*context, *emitted[:j]],
                                  (ids[done + j], logprobs[done + j]))
            spec.pool.extend(key, emitted)
            context += emitted
            done += len(emitted)
            num_forwards += 1
        spec.pool.finish(key, len(tokens))
        forwards.append((len(tokens), num_forwards))
    tail = sorted(forwards)[-max(1, len(forwards) // 4):]
    return {"tokens_per_forward": sum(t for t, _ in forwards) / sum(f for _, f in forwards),
            "tail_tokens_per_forward": sum(t for t, _ in tail) / sum(f for _, f in tail)}


def load_seed() -> int:
    from dynaresize.config import load_config

    return load_config(None, [*TASK]).run.seed


def format_block(args: argparse.Namespace, rows: list[dict[str, Any]],
                 results: list[tuple[tuple[int, int, int, str, str], dict[str, float]]]
                 ) -> str:
    flag = " --coupled" if args.coupled else ""
    head = (f"`python bench/drafter_replay.py --temperature {args.temperature:g}{flag}` "
            f"(smollm2-135m on vLLM, reasoning_gym gsm_symbolic, chat; {len(rows)} responses "
            f"of up to {args.max_new_tokens} tokens, {sum(len(r['tokens']) for r in rows)} "
            f"tokens, {args.prompts} prompts x {args.samples} samples x {args.rounds} steps, "
            f"served one at a time; measured {time.strftime('%Y-%m-%d')}). Tokens per forward "
            f"with exact speculation (1.00 without), every setting on the same responses "
            f"(drafts: `tokens`, the n-gram drafters; `coupled`, coupled drafts where a "
            f"stored distribution gives one, from the rows the verify forwards kept):")
    lines = ["| max_draft_tokens | min_ngram | max_ngram | drafters | drafts | tokens per forward "
             "| tail (longest quarter) |", "|---:|---:|---:|---|---|---:|---:|"]
    lines += [f"| {d} | {lo} | {hi} | {src} | {kind} | {r['tokens_per_forward']:.3f} "
              f"| {r['tail_tokens_per_forward']:.3f} |" for (d, lo, hi, src, kind), r in results]
    return "\n".join([head, "", *lines])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--cache", help="responses JSON: read if it exists, else written")
    parser.add_argument("--coupled", action="store_true",
                        help="also replay coupled drafts (a transformers forward per response)")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.is_file():
        rows = json.loads(cache.read_text())
    else:
        rows = generate(args)
        if cache is not None:
            cache.write_text(json.dumps(rows))
    results = [((*s, "tokens"), replay(rows, *s, args.max_new_tokens)) for s in GRID]
    if args.coupled:
        tops = top_logprobs_of(rows)
        results += [((*s, "coupled"), replay(rows, *s, args.max_new_tokens, args.temperature,
                                             tops)) for s in COUPLED]
    text = format_block(args, rows, results)
    print(text)
    if args.write_results:
        write_block(*markers(args.temperature), text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
