"""A real tail on vLLM, training live, with speculative decoding off and on: two runs of
`examples/real-tail-vllm.toml` (SmolLM2-135M, gsm_symbolic chain-of-thought answers of up to
256 tokens, 2 vLLM rollout devices and 1 training device), one after the other, compared.

Reported: whether both wrote the same records (samples.jsonl without `device`, which follows
placement timing) and the same weights (`param_sha256`), the rollout's and the step's seconds,
rollout tokens/s, the tail's tokens/s (metrics.jsonl `tail_tokens_per_s`: each step's longest
quarter of requests, the same requests in both runs, from first submission to completion;
the mean over the steps), and the run's acceptance (`summary.json` "speculation": tokens per
forward of a request, accepted drafts per verify iteration). The runs follow each other on a shared
machine, so their seconds carry its load; `bench/speculative_vllm.py` measures the speed side by
side, step by step. `--write-results` writes the block into docs/results.md (with
`--full-batch N`, which overrides the example's `rollout.speculative.full_batch` in the run with
speculation, or `--temperature T`, which overrides `rollout.temperature` in both runs, its own
block).

    python bench/speculative_live.py --steps 3 --write-results
    python bench/speculative_live.py --full-batch 0 --write-results   # drafts at any load
    python bench/speculative_live.py --temperature 1.0 --write-results
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policies import block_markers, write_block  # noqa: E402  (bench/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- bench-speculative-live:start -->", "<!-- bench-speculative-live:end -->"
CONFIG = ROOT / "examples" / "real-tail-vllm.toml"
EXAMPLE_TEMPERATURE = float(tomllib.loads(CONFIG.read_text(encoding="utf-8"))["rollout"]
                            ["temperature"])


def markers(full_batch: int | None, temperature: float | None = None) -> tuple[str, str]:
    """The block of the example's settings, or of `--full-batch N` / `--temperature T`: each
    its own."""
    if full_batch is None and temperature is None:
        return START, END
    name = "bench-speculative-live"
    if full_batch is not None:
        name += f"-fb{full_batch}"
    if temperature is not None:
        name += f"-t{temperature:g}"
    return block_markers(name)


def train(out: Path, steps: int, speculation: bool, full_batch: int | None = None,
          temperature: float | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "dynaresize", "train", "--config", str(CONFIG), "--out",
           str(out), "--set", f"run.steps={steps}", "--set", "output.progress='plain'",
           "--set", f"rollout.speculative.enabled={'true' if speculation else 'false'}"]
    if full_batch is not None:
        cmd += ["--set", f"rollout.speculative.full_batch={full_batch}"]
    if temperature is not None:
        cmd += ["--set", f"rollout.temperature={temperature}"]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return load_run(out)


def load_run(out: Path) -> dict[str, Any]:
    """A finished run's metrics, records (without `device`) and summary (a pair kept with
    `--out` can be compared again: `compare(load_run(off), load_run(on))`)."""
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = {}
    for line in (out / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        records[(r["step"], r["prompt"], r["sample"])] = {k: v for k, v in r.items()
                                                          if k != "device"}
    summary = json.loads((out / "summary.json").read_text())
    return {"metrics": metrics, "records": records, "summary": summary}


def compare(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    def total(run: dict[str, Any], key: str) -> float:
        return sum(m[key] for m in run["metrics"])

    lengths = sorted(r["response_tokens"] for r in off["records"].values())
    return {
        "steps": len(off["metrics"]), "samples": len(off["records"]),
        "same_records": off["records"] == on["records"],
        "same_weights": off["summary"]["param_sha256"] == on["summary"]["param_sha256"],
        "response_tokens": {"median": lengths[len(lengths) // 2], "max": lengths[-1]},
        "rollout_s": {n: total(r, "rollout_s") for n, r in (("off", off), ("on", on))},
        "step_s": {n: total(r, "step_s") / len(r["metrics"])
                   for n, r in (("off", off), ("on", on))},
        "rollout_tokens_per_s": {n: total(r, "tokens") / total(r, "rollout_s")
                                 for n, r in (("off", off), ("on", on))},
        "tail_tokens_per_s": {n: _mean_tail(r) for n, r in (("off", off), ("on", on))},
        "speculation": on["summary"]["speculation"],
    }


def _mean_tail(run: dict[str, Any]) -> float | None:
    """The mean over steps of metrics.jsonl's `tail_tokens_per_s` (None if no step has it)."""
    rates = [m["tail_tokens_per_s"] for m in run["metrics"] if "tail_tokens_per_s" in m]
    return sum(rates) / len(rates) if rates else None


def _tail_cells(tail: dict[str, float | None]) -> tuple[str, str, str]:
    """The tail's tokens/s off and on, and their ratio (`-` where a run has none)."""
    off, on = tail["off"], tail["on"]
    cells = tuple("-" if t is None else f"{t:.2f}" for t in (off, on))
    ratio = "-" if off is None or on is None else f"{on / off:.2f}x"
    return cells[0], cells[1], ratio


def format_block(r: dict[str, Any], full_batch: int | None = None,
                 temperature: float | None = None) -> str:
    rs, ss, ts, sp = r["rollout_s"], r["step_s"], r["rollout_tokens_per_s"], r["speculation"]
    tail_off, tail_on, tail_ratio = _tail_cells(r["tail_tokens_per_s"])
    knob = "" if full_batch is None else f" --full-batch {full_batch}"
    knob += "" if temperature is None else f" --temperature {temperature:g}"
    budget = "" if full_batch is None else \
        f"; speculation with rollout.speculative.full_batch = {full_batch}"
    temp = EXAMPLE_TEMPERATURE if temperature is None else temperature
    return "\n".join([
        f"`python bench/speculative_live.py --steps {r['steps']}{knob}` "
        f"(examples/real-tail-vllm.toml{budget}:"
        f" SmolLM2-135M on vLLM, gsm_symbolic chain of thought at temperature {temp:g}, "
        f"{r['samples']} samples over {r['steps']} steps, responses of median "
        f"{r['response_tokens']['median']} and up to {r['response_tokens']['max']} tokens; "
        f"the two runs one after the other on the shared 2-core machine):",
        "",
        "| speculation | rollout s (all steps) | rollout tokens/s "
        "| tail tokens/s (longest quarter) | step s (mean) |",
        "|---|---:|---:|---:|---:|",
        f"| off | {rs['off']:.1f} | {ts['off']:.2f} | {tail_off} | {ss['off']:.1f} |",
        f"| on | {rs['on']:.1f} | {ts['on']:.2f} | {tail_on} | {ss['on']:.1f} |",
        "",
        f"On / off: rollout **{rs['off'] / rs['on']:.2f}x** faster, the tail's tokens/s "
        f"**{tail_ratio}**, step {ss['off'] / ss['on']:.2f}x. Records identical: "
        f"**{'yes' if r['same_records'] else 'NO'}**; weights identical: "
        f"{'yes' if r['same_weights'] else 'no'}. Acceptance (summary.json): "
        f"{sp['tokens_per_forward']} tokens per forward of a request, "
        f"{sp['mean_accepted_per_verify']} accepted drafts per verify iteration "
        f"({sp['accepted_tokens']} of {sp['draft_tokens']} draft tokens)."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None,
                        help="keep the two run folders here (default: a temporary folder)")
    parser.add_argument("--full-batch", type=int, default=None, metavar="N",
                        help="rollout.speculative.full_batch of the run with speculation "
                        "(default: the example's, 3; 0 drafts at any load)")
    parser.add_argument("--temperature", type=float, default=None, metavar="T",
                        help="rollout.temperature of both runs "
                        f"(default: the example's, {EXAMPLE_TEMPERATURE:g})")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    if args.full_batch is not None and args.full_batch < 0:
        parser.error(f"--full-batch must be >= 0, got {args.full_batch}")
    if args.temperature is not None and args.temperature <= 0:
        parser.error(f"--temperature must be > 0, got {args.temperature}")
    t = None if args.temperature == EXAMPLE_TEMPERATURE else args.temperature  # the example's
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        off = train(root / "off", args.steps, speculation=False, temperature=t)
        on = train(root / "on", args.steps, speculation=True, full_batch=args.full_batch,
                   temperature=t)
    result = compare(off, on)
    block = format_block(result, args.full_batch, t)
    print(block)
    if args.write_results:
        write_block(*markers(args.full_batch, t), block)


if __name__ == "__main__":
    main()
