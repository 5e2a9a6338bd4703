"""Episodes with a sleeping tool on the builtin engine: engine work during tool waits, one
episode at a time against all episodes in flight (issue 26, acceptance 3 in miniature).

    python bench/episodes.py                 # 8 episodes x 3 turns, tool 0.2 s, write docs
    python bench/episodes.py --tool-s 0.5 --episodes 16 --no-write

One process, both modes side by side on the same engine setup (`envs.serve.EngineTurns` over
one `RolloutEngine`, a random tiny Qwen2 over the character tokenizer, one thread), real
clock. Reports wall seconds, engine busy seconds, the engine seconds that fell inside tool
waits (`overlap_s`), and checks that both modes wrote the same episode records. Writes
docs/agents.md between `<!-- episodes-bench:start -->` and `<!-- episodes-bench:end -->`.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from dynaresize.envs.base import Feedback, TurnContext, turn_rng
from dynaresize.envs.driver import EpisodeSpec, run_episodes, timing_summary
from dynaresize.envs.episode import contract_view, episode_record
from dynaresize.envs.render import PlainRenderer
from dynaresize.envs.serve import EngineTurns, InlineEngine, overlap_s
from dynaresize.protocols import RealClock
from dynaresize.rollout.engine import RolloutEngine
from dynaresize.tasks.base import Prompt
from dynaresize.tasks.tokenizer import CharTokenizer

DOC = Path(__file__).resolve().parents[1] / "docs" / "agents.md"
START, END = "<!-- episodes-bench:start -->", "<!-- episodes-bench:end -->"
TOK = CharTokenizer()


class SleepTool:
    """Answers each turn after `tool_s` seconds with a seeded number; ends at the last turn."""

    name = "sleep_tool"

    def __init__(self, tool_s: float, max_turns: int) -> None:
        self.tool_s = tool_s
        self.max_turns = max_turns

    async def step(self, ctx: TurnContext) -> Feedback:
        await asyncio.sleep(self.tool_s)
        if ctx.last_turn:
            return Feedback(done=True, reward=min(1.0, len(ctx.text) / 16))
        return Feedback(text=str(turn_rng(ctx).randrange(1000)), role="tool")


def make_engine(hidden: int) -> InlineEngine:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=TOK.vocab_size, hidden_size=hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=2 * hidden, max_position_embeddings=1024,
                         tie_word_embeddings=True)
    engine = RolloutEngine(Qwen2ForCausalLM(config), eos_token_id=TOK.eos_id, device_index=0,
                           max_running=64)
    return InlineEngine(engine)


def run_mode(args: argparse.Namespace, serial: bool) -> dict:
    env = SleepTool(args.tool_s, args.turns)
    specs = [EpisodeSpec(Prompt(i, TOK.encode_prompt(f"{i}*{i}="), "0"), step=0, sample=0,
                         version=0, run_seed=1, max_new_tokens=args.max_new_tokens)
             for i in range(args.episodes)]
    clock = RealClock()

    async def main():
        turns = EngineTurns([engine], clock)
        out = []
        async with turns.serving():
            t0 = time.perf_counter()
            for group in ([[s] for s in specs] if serial else [specs]):
                out += await run_episodes(env, group, PlainRenderer(TOK), turns, clock)
            wall_s = time.perf_counter() - t0
        return out, turns, wall_s, engine.engine.stats

    engine = make_engine(args.hidden)
    episodes, turns, wall_s, stats = asyncio.run(main())
    waits = [w for ep in episodes for w in ep.env_waits]
    return {"wall_s": wall_s, "busy_s": turns.stats[0].busy_s,
            "busy_in_waits_s": overlap_s(turns.stats[0].busy, waits),
            "prefill_tokens": stats.num_prefill_tokens,
            "generated_tokens": stats.num_generated_tokens,
            "summary": timing_summary(episodes),
            "records": [contract_view(episode_record(ep, record_tokens=True))
                        for ep in episodes]}


def report(args: argparse.Namespace, serial: dict, parallel: dict) -> str:
    s = parallel["summary"]
    same = serial["records"] == parallel["records"]
    rows = [f"| {name} | {r['wall_s']:.2f} | {r['busy_s']:.2f} | {r['busy_in_waits_s']:.2f} |"
            for name, r in (("one episode at a time", serial), ("all in flight", parallel))]
    return "\n".join([
        f"`python bench/episodes.py` ({args.episodes} episodes × {args.turns} turns, tool "
        f"{args.tool_s:g} s, ≤ {args.max_new_tokens} tokens per turn, tiny Qwen2 hidden "
        f"{args.hidden}, one builtin engine, one thread; {s['tokens_per_turn']:.1f} model "
        f"tokens and {s['observation_tokens_per_turn']:.1f} observation tokens per turn; "
        "shared 2-core machine):",
        "",
        "| mode | wall s | engine busy s | engine busy s inside tool waits |",
        "|---|---|---|---|",
        *rows,
        "",
        f"All in flight finishes {serial['wall_s'] / parallel['wall_s']:.1f}x sooner; "
        f"{parallel['busy_in_waits_s'] / max(parallel['busy_s'], 1e-9):.0%} of the engine's "
        "work ran while some episode waited on its tool. Same episode records in both modes: "
        f"{'yes' if same else 'NO'}. The engine prefilled {parallel['prefill_tokens']:,} "
        f"context tokens for {parallel['generated_tokens']:,} generated: each turn feeds "
        "its episode's whole context again (keeping it between turns is still to build)."])


def write_block(text: str) -> None:
    doc = DOC.read_text()
    if START not in doc or END not in doc:
        doc = doc.rstrip("\n") + f"\n\n{START}\n{END}\n"
    DOC.write_text(re.sub(re.escape(START) + ".*?" + re.escape(END),
                          lambda _: f"{START}\n{text}\n{END}", doc, flags=re.S))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tool-s", type=float, default=0.2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    serial = run_mode(args, serial=True)
    parallel = run_mode(args, serial=False)
    text = report(args, serial, parallel)
    print(text)
    if not args.no_write:
        write_block(text)


if __name__ == "__main__":
    main()
