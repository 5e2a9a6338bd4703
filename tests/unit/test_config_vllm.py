"""rollout.engine validation: bad values, vLLM missing, a model vLLM's CPU attention refuses."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from dynaresize.config import ConfigError, load_config


def _with_vllm(monkeypatch: pytest.MonkeyPatch, installed: bool) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if installed else None) if name == "vllm"
                        else real(name, *a))


def test_engine_names_are_checked() -> None:
    assert load_config(None, []).rollout.engine == "builtin"
    with pytest.raises(ConfigError, match="allowed: builtin, vllm"):
        load_config(None, ["rollout.engine='sglang'"])
    with pytest.raises(ConfigError, match="vllm_kv_cache_bytes"):
        load_config(None, ["rollout.vllm_kv_cache_bytes=0"])


def test_missing_vllm_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_vllm(monkeypatch, installed=False)
    with pytest.raises(ConfigError, match="bash scripts/setup.sh --with-vllm"):
        load_config(None, ["rollout.engine='vllm'", "model.num_heads=2"])
    # the twin and a run directory's config (calibrate) need no vLLM
    load_config(None, ["rollout.engine='vllm'", "devices.backend='sim'"])
    load_config(None, ["rollout.engine='vllm'"], check_machine=False)


def test_head_dim_vllm_cannot_serve_on_cpu(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    _with_vllm(monkeypatch, installed=True)
    with pytest.raises(ConfigError, match=r"head_dim 16 .*model.num_heads=2"):
        load_config(None, ["rollout.engine='vllm'", "model.num_heads=4"])  # 64 / 4
    assert load_config(None, ["rollout.engine='vllm'"]).model.num_heads == 2  # the default
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 96, "num_attention_heads": 6}))
    with pytest.raises(ConfigError, match="head_dim 16"):
        load_config(None, ["rollout.engine='vllm'", f"model.path='{tmp_path}'"])
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 96, "num_attention_heads": 6, "head_dim": 64}))
    load_config(None, ["rollout.engine='vllm'", f"model.path='{tmp_path}'"])


def test_cli_exits_2_before_starting_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynaresize.cli import main

    _with_vllm(monkeypatch, installed=False)
    assert main(["train", "--set", "rollout.engine='vllm'", "--set", "model.num_heads=2"]) == 2
