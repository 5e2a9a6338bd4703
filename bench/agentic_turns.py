"""The twin's multi-turn workload calibrated from a live multi-turn run (issue 26, acceptance 4).

    python bench/agentic_turns.py                # live run + twin, writes docs
    python bench/agentic_turns.py --live-only    # live run only: the timing file
    python bench/agentic_turns.py --twin-only    # twin from docs/data/agentic_timing.json
    python bench/agentic_turns.py --no-write --episodes 8 --gpus 32 --steps 3

Live: episodes on the builtin engine (`rollout.engine.RolloutEngine` through
`envs.serve.EngineTurns`, one thread) driven by `envs.driver.run_episodes`, half in a `ToolEnv`
with a calculator whose runtime takes `--tool-s` seconds per call (`SandboxedToolEnv`;
arithmetic questions after one solved example of the call format, up to 3 turns), half in a
`RetryEnv` (a wrong answer gets one more try). The model is SmolLM2-135M-Instruct with its
chat template (`model.source = "smollm2-135m"`, docs/real-training.md) if it is materialised,
else a tiny random Qwen2 over the character tokenizer. Writes docs/data/agentic_timing.json:
`envs.driver.timing_summary` (turns per episode, model and observation tokens per turn, tool
p50/p90) plus the log std-dev of turn lengths, the turn limit and the engine's tokens/s.

Twin: `sim.episodes.episode_model_from_summary` fits the episode model to that file (as
`dynaresize calibrate --episodes` does), over the `agentic` preset's batch and prompts; then
hysteresis, static and colocated at 32, 64 and 256 GPUs (h100-7b), staleness 0 and 1; the same
for the `agentic-turns` preset (agentic's turn lengths, 3 turns, 1 s tools). Writes the block
between `<!-- agentic-turns:start -->` and `<!-- agentic-turns:end -->` in docs/results.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policies import write_block  # noqa: E402  (bench/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data" / "agentic_timing.json"
DOC = ROOT / "docs" / "results.md"
START, END = "<!-- agentic-turns:start -->", "<!-- agentic-turns:end -->"
POLICIES = ("static", "colocated", "hysteresis")
EXAMPLE_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}' \
    '</tool_call>'


class SandboxedToolEnv:
    """`ToolEnv` whose tool runtime takes `tool_s` seconds to answer any call, a malformed
    one included (a sandbox that starts, runs and reports): every tool turn waits. A call
    left unclosed (no `</tool_call>`, which `ToolEnv` reads as a final answer) gets a parse
    error back, as other malformed calls do."""

    def __init__(self, inner: Any, tool_s: float) -> None:
        self.inner, self.tool_s = inner, tool_s
        self.name, self.max_turns = inner.name, inner.max_turns

    async def step(self, ctx: Any) -> Any:
        from dynaresize.envs.base import Feedback

        if "<tool_call>" not in ctx.text or ctx.last_turn:
            return await self.inner.step(ctx)
        await asyncio.sleep(self.tool_s)
        if "</tool_call>" not in ctx.text:
            return Feedback(text="error: a tool call ends with </tool_call>", role="tool",
                            info={"error": "unclosed"})
        return await self.inner.step(ctx)



def load_model(max_running: int) -> tuple[Any, Any, Any, str]:
    """(engine, tokenizer, renderer, name): SmolLM2 with its chat template, or the tiny one."""
    import torch

    from dynaresize.envs.render import ChatRenderer, PlainRenderer
    from dynaresize.model_sources import is_materialised, source_dir
    from dynaresize.rollout.engine import RolloutEngine

    torch.set_num_threads(1)
    if is_materialised("smollm2-135m"):
        from transformers import AutoModelForCausalLM

        from dynaresize.tasks.model_tokenizer import ModelTokenizer

        path = source_dir("smollm2-135m")
        tok: Any = ModelTokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                     dtype=torch.float32)
        renderer: Any = ChatRenderer(tok)
        name = "SmolLM2-135M-Instruct (chat template)"
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from dynaresize.tasks.tokenizer import CharTokenizer

        tok = CharTokenizer()
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            max_position_embeddings=2048, tie_word_embeddings=True))
        renderer = PlainRenderer(tok)
        name = "tiny random Qwen2 (character tokenizer)"
    engine = RolloutEngine(model, eos_token_id=tok.eos_id, device_index=0,
                           max_running=max_running, whole_prompt_prefill=True)
    return engine, tok, renderer, name


def prompts(tok: Any, n: int, tools: Any, offset: int) -> list[Any]:
    """Arithmetic questions; with `tools`, asked to use the calculator (chat models)."""
    import random

    from dynaresize.envs.tools import tools_prompt
    from dynaresize.tasks.base import Prompt

    rng = random.Random(offset)
    out = []
    for i in range(n):
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        ask = f"What is {a} * {b}? Give the final answer as <answer>NUMBER</answer>."
        if not hasattr(tok, "chat"):
            ids = tok.encode_prompt(f"{a}*{b}=")
        elif tools:  # one solved example of the call format, then the question
            ids = tok.chat([{"role": "system", "content": tools_prompt(tools)},
                            {"role": "user", "content": "What is 12 * 7? Use the calculator."},
                            {"role": "assistant", "content": EXAMPLE_CALL},
                            {"role": "tool", "content": "84"},
                            {"role": "assistant", "content": "<answer>84</answer>"},
                            {"role": "user", "content": f"What is {a} * {b}? Use the "
                                                        "calculator."}])
        else:
            ids = tok.chat([{"role": "user", "content": ask}])
        out.append(Prompt(offset + i, tuple(ids), str(a * b)))
    return out


def live_run(args: argparse.Namespace) -> dict[str, Any]:
    """The live episodes (module docstring): the summary written to DATA."""
    from dynaresize.envs.adapters import RetryEnv, ToolEnv, exact_scorer
    from dynaresize.envs.driver import EpisodeSpec, run_episodes, timing_summary
    from dynaresize.envs.serve import EngineTurns, InlineEngine, overlap_s
    from dynaresize.envs.tools import Tool, calculator
    from dynaresize.protocols import RealClock

    tools = [Tool.from_function(calculator)]
    engine, tok, renderer, name = load_model(args.max_running)
    half = args.episodes // 2
    envs = ((SandboxedToolEnv(ToolEnv(tools, exact_scorer, max_turns=3), args.tool_s),
             prompts(tok, half, tools, 0)),
            (RetryEnv(exact_scorer, max_turns=2), prompts(tok, args.episodes - half, None,
                                                           1000)))
    clock = RealClock()

    async def main() -> tuple[list[Any], Any, float]:
        turns = EngineTurns([InlineEngine(engine)], clock)
        t0 = time.perf_counter()
        async with turns.serving():
            groups = await asyncio.gather(*(run_episodes(env, [
                EpisodeSpec(p, step=0, sample=0, version=0, run_seed=1,
                            max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature) for p in ps], renderer,
                turns, clock) for env, ps in envs))
        return [ep for g in groups for ep in g], turns, time.perf_counter() - t0

    episodes, turns, wall_s = asyncio.run(main())
    summary = timing_summary(episodes)
    lengths = [len(t.tokens) for ep in episodes for t in ep.turns]
    obs = [len(o.tokens) for ep in episodes for o in ep.observations]
    busy = turns.stats[0].busy
    summary.update(
        max_turns=3, max_new_tokens=args.max_new_tokens,
        model_token_sigma=statistics.pstdev(math.log(n) for n in lengths if n > 0),
        observation_token_sigma=statistics.pstdev(math.log(n) for n in obs if n > 0)
        if obs else 0.0,
        engine_tokens_per_s=engine.stats.num_generated_tokens / max(1e-9, turns.stats[0].busy_s),
        engine_busy_s=turns.stats[0].busy_s, wall_s=wall_s,
        engine_busy_in_tool_waits_s=overlap_s(busy, [w for ep in episodes
                                                     for w in ep.env_waits]),
        env_s_values=sorted(round(o.env_s, 6) for ep in episodes for o in ep.observations),
        tool_calls=sum(1 for ep in episodes for o in ep.observations if o.role == "tool"),
        mean_reward=statistics.fmean(ep.reward for ep in episodes))
    return {"summary": summary, "setup": {
        "model": name, "episodes": args.episodes, "tool_s": args.tool_s,
        "temperature": args.temperature,
        "envs": "ToolEnv (calculator in a sandbox that takes tool_s per call, 3 turns) + "
                "RetryEnv (2 tries)",
        "engine": f"builtin RolloutEngine, one thread, max_running {args.max_running}, "
                  "whole-prompt prefill, no context kept between turns"}}


def twin(summary: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Hysteresis vs static vs colocated on the live-calibrated and the preset episodes."""
    from dynaresize.sim.episodes import episode_model_from_summary, episode_workload
    from dynaresize.sim.run import simulate

    live = episode_model_from_summary(summary, source="docs/data/agentic_timing.json")
    rows = []
    for label, model in (("live-calibrated", live), ("agentic-turns", "agentic-turns")):
        for gpus in args.gpus:
            for staleness in (0, 1):
                wl = episode_workload(model, seed=0)
                out = simulate(wl, gpus, POLICIES, steps=args.steps, staleness=staleness,
                               seed=0, workers=args.workers)
                by = {r["policy"]: r for r in out["results"]}
                rows.append({"workload": label, "gpus": gpus, "staleness": staleness,
                             **{f"{p}_samples_per_s": by[p]["samples_per_s"] for p in POLICIES},
                             "static_split": by["static"]["split"]["rollout"],
                             "hysteresis_resizes": by["hysteresis"]["num_resizes"]})
                print(rows[-1], flush=True)
    return rows


def report(data: dict[str, Any], rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    s, setup = data["summary"], data["setup"]
    lines = [
        f"`python bench/agentic_turns.py`: {setup['episodes']} live episodes of "
        f"{setup['model']}, {setup['envs']}, tool sleep {setup['tool_s']:g} s, "
        f"{setup['engine']} (shared 2-core machine): {s['turns_per_episode']:.2f} turns per "
        f"episode, {s['tokens_per_turn']:.1f} model and {s['observation_tokens_per_turn']:.1f} "
        f"observation tokens per turn, {s['tool_calls']} tool calls, environment answers p50 "
        f"{s['env_s_p50']:.3f} s, p90 {s['env_s_p90']:.3f} s, engine "
        f"{s['engine_tokens_per_s']:.1f} generated tokens/s "
        f"({s['engine_busy_in_tool_waits_s']:.1f} of its {s['engine_busy_s']:.1f} busy s "
        "inside tool waits). Data: docs/data/agentic_timing.json. The retry feedback answers "
        f"at once; a tool answer ({setup['tool_s']:g} s in its sandbox) took "
        f"{min(v for v in s['env_s_values'] if v > 0.1):.2f}-{max(s['env_s_values']):.2f} s, "
        "because the builtin engine steps synchronously in the serve loop: an answer reaches "
        "its episode when the engine step in progress ends. The twin resamples these measured "
        "answers as its tool time.",
        "",
        f"The twin (h100-7b, {args.steps} steps, the `agentic` batch of 256 prompts x 8 and "
        "its prompts; `live-calibrated`: the episode model `dynaresize calibrate --episodes FILE` "
        "fits to that file; `agentic-turns`: the preset), samples/s and hysteresis's ratio:",
        "",
        "| episodes | GPUs | staleness | static (split) | colocated | hysteresis | "
        "hyst / static | hyst / colocated |",
        "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        h = r["hysteresis_samples_per_s"]
        lines.append(
            f"| {r['workload']} | {r['gpus']} | {r['staleness']} | "
            f"{r['static_samples_per_s']:.2f} ({r['static_split']}) | "
            f"{r['colocated_samples_per_s']:.2f} | {h:.2f} | "
            f"{h / r['static_samples_per_s']:.2f}x | {h / r['colocated_samples_per_s']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--tool-s", type=float, default=0.3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--gpus", type=int, nargs="+", default=[32, 64, 256])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--twin-only", action="store_true",
                        help="skip the live run: read docs/data/agentic_timing.json")
    parser.add_argument("--live-only", action="store_true",
                        help="write docs/data/agentic_timing.json, skip the twin")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.twin_only:
        data = json.loads(DATA.read_text())
    else:
        data = live_run(args)
        print(json.dumps(data, indent=2))
        if not args.no_write:
            DATA.parent.mkdir(parents=True, exist_ok=True)
            DATA.write_text(json.dumps(data, indent=2) + "\n")
    if args.live_only:
        return
    text = report(data, twin(data["summary"], args), args)
    print(text)
    if not args.no_write:
        write_block(START, END, text, DOC)


if __name__ == "__main__":
    main()
