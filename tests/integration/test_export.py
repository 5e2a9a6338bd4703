"""`dynaresize export` (app/export.py): a run directory's trained tiny model becomes an HF
folder that transformers loads as it is (model, tokenizer, generation config), and whose greedy
generations equal our rollout engine's token for token on 16 prompts. The vLLM load of the
same folder: tests/integration/test_export_vllm.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dynaresize.cli import main
from dynaresize.config import load_config, to_toml
from dynaresize.core.types import RequestSpec
from dynaresize.models import build_model
from dynaresize.tasks.tokenizer import CharTokenizer

NUM_PROMPTS, MAX_NEW = 16, 16
TEXTS = [f"{i}+{3 * i + 1}=" if i % 2 else f"count to {i}: " for i in range(NUM_PROMPTS)]


def trained_state(cfg) -> dict[str, torch.Tensor]:
    """The version-0 tiny model moved by seeded noise: weights no fresh init has."""
    tok = CharTokenizer()
    model = build_model(cfg.model, tok.vocab_size, eos_token_id=tok.eos_id,
                        bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)
    g = torch.Generator().manual_seed(11)
    state = {k: v + 0.5 * v.std().nan_to_num(0.02) * torch.randn(v.shape, generator=g)
             for k, v in model.state_dict().items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied, as trained
    return state


def make_run_dir(root: Path, overrides: list[str] = ()) -> tuple[Path, dict]:
    cfg = load_config(None, list(overrides), check_machine=False)
    run = root / "run"
    run.mkdir()
    (run / "config.toml").write_text(to_toml(cfg))
    state = trained_state(cfg)
    torch.save(state, run / "model.pt")
    return run, state


def engine_greedy(cfg, state: dict[str, torch.Tensor], prompts: list[tuple[int, ...]]
                  ) -> list[list[int]]:
    """Greedy tokens of our rollout engine (batch-invariant) on the same weights."""
    from dynaresize.rollout.engine import RolloutEngine

    tok = CharTokenizer()
    model = build_model(cfg.model, tok.vocab_size, eos_token_id=tok.eos_id,
                        bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)
    model.load_state_dict(state, strict=False)
    engine = RolloutEngine(model, eos_token_id=tok.eos_id, device_index=0, max_running=8)
    for i, prompt in enumerate(prompts):
        engine.add(RequestSpec(0, i, 0, 0, prompt, MAX_NEW, seed=i, temperature=0.0))
    done = engine.run(120.0, until_empty=True)
    by_prompt = {c.spec.prompt: list(c.tokens) for c in done}
    return [by_prompt[i] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, object]:
    root = tmp_path_factory.mktemp("export")
    run, state = make_run_dir(root)
    assert main(["export", str(run), "--out", str(root / "hf")]) == 0
    return root / "hf", state, load_config(run / "config.toml", [], check_machine=False)


def test_the_folder_has_the_hf_files(exported) -> None:
    out, _, _ = exported
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= names


def test_transformers_loads_it_and_greedy_equals_our_engine(exported) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, state, cfg = exported
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    for name, value in state.items():  # the trained weights, not a fresh init
        assert torch.equal(model.state_dict()[name], value), name
    hf_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    char = CharTokenizer()
    prompts = [char.encode_prompt(text) for text in TEXTS]
    assert [(hf_tok.bos_token_id, *hf_tok(text)["input_ids"]) for text in TEXTS] == prompts
    assert hf_tok.decode(list(prompts[2]), skip_special_tokens=True) == TEXTS[2]
    ours = engine_greedy(cfg, state, prompts)
    theirs = []
    for prompt in prompts:
        with torch.no_grad():
            got = model.generate(torch.tensor([prompt]), do_sample=False,
                                 max_new_tokens=MAX_NEW)
        theirs.append(got[0, len(prompt):].tolist())
    assert theirs == ours
    assert len({tuple(t) for t in ours}) > 1  # not one degenerate answer for every prompt


def test_export_of_a_missing_run_is_a_usage_error(tmp_path: Path, capsys) -> None:
    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "hf")]) == 2
    assert "config.toml" in capsys.readouterr().err
