"""The exported folder (`dynaresize export`) loads in vLLM (CPU) as it is, tokenizer
included, and vLLM's greedy generations from it equal our rollout engine's token for token on
16 prompts. Skipped without vLLM (`bash scripts/setup.sh --with-vllm`; CI installs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from test_export import MAX_NEW, TEXTS, engine_greedy, make_run_dir  # noqa: E402

import dynaresize.rollout.vllm_engine  # noqa: E402,F401  (in-process engine core, as ours)
from dynaresize.cli import main  # noqa: E402
from dynaresize.config import load_config  # noqa: E402
from dynaresize.tasks.tokenizer import CharTokenizer  # noqa: E402


def test_vllm_loads_the_export_and_greedy_equals_our_engine(tmp_path: Path) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from dynaresize.rollout.vllm_world import private_world

    run, state = make_run_dir(tmp_path)
    out = tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    cfg = load_config(run / "config.toml", [], check_machine=False)
    prompts = [CharTokenizer().encode_prompt(text) for text in TEXTS]
    ours = engine_greedy(cfg, state, prompts)
    with private_world():
        llm = LLM(model=str(out), dtype="float32", enforce_eager=True, max_model_len=512,
                  kv_cache_memory_bytes=32 * 2**20, distributed_executor_backend="uni",
                  seed=0)
    assert llm.get_tokenizer().encode(TEXTS[1], add_special_tokens=False) == \
        list(prompts[1][1:])
    outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                           SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    got = [list(o.outputs[0].token_ids) for o in outputs]
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if core is not None and core.model_executor is not None:
        core.model_executor.shutdown()
    assert got == ours
