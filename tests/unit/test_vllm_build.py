"""A vLLM engine start that fails leaves no model folder in /dev/shm (rollout.vllm_build,
rollout.vllm_world.model_dir); vLLM is never started: its construction is replaced."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch.distributed.distributed_c10d as c10d

from dynaresize.config import load_config
from dynaresize.rollout import vllm_world
from dynaresize.rollout.vllm_build import build_vllm_engine


class Template:
    """Stands in for the version-0 transformers model: `save_pretrained` writes a weights
    file, then fails (`fail`), writes nothing more (`no_config`) or writes config.json."""

    def __init__(self, fail: bool = False, no_config: bool = False) -> None:
        self.config = SimpleNamespace(max_position_embeddings=512)
        self.fail, self.no_config = fail, no_config

    def save_pretrained(self, path: str) -> None:
        Path(path, "model.safetensors").write_bytes(b"weights")
        if self.fail:
            raise OSError("No space left on device")
        if not self.no_config:
            Path(path, "config.json").write_text("{}")


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The folders `model_dir` creates (the process's torch world is put back after)."""
    saved, count = c10d._world, c10d._world.group_count
    paths: list[str] = []
    mkdtemp = vllm_world.tempfile.mkdtemp

    def recording(**kwargs: str) -> str:
        paths.append(mkdtemp(**kwargs))
        return paths[-1]

    monkeypatch.setattr(vllm_world.tempfile, "mkdtemp", recording)
    yield paths
    c10d._world = saved
    c10d._world.group_count = count


def start_with(monkeypatch: pytest.MonkeyPatch, start: Callable[..., object]) -> None:
    """vLLM engines start by `start` (the real module is not imported: no vLLM settings)."""
    fake = ModuleType("dynaresize.rollout.vllm_engine")
    fake.VllmRolloutEngine = start  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dynaresize.rollout.vllm_engine", fake)


def build(template: Template) -> object:
    return build_vllm_engine(load_config(None, []).rollout, template, eos_token_id=1,
                             device_index=0, torch_device="cpu")


def test_a_failing_engine_start_removes_the_model_folder(made, monkeypatch) -> None:
    seen: list[bool] = []

    def failing_start(path: str, **kwargs: object) -> None:
        seen.append(os.path.isfile(os.path.join(path, "config.json")))  # written for vLLM
        raise RuntimeError("vLLM failed to start")

    start_with(monkeypatch, failing_start)
    with pytest.raises(RuntimeError, match="failed to start"):
        build(Template())
    assert seen == [True] and len(made) == 1
    assert not os.path.exists(made[0])


@pytest.mark.parametrize("template, error", [(Template(fail=True), "No space left"),
                                             (Template(no_config=True), "no config.json")])
def test_a_failing_save_removes_the_model_folder(made, monkeypatch, template, error) -> None:
    start_with(monkeypatch, lambda *a, **k: pytest.fail("vLLM started"))
    with pytest.raises((OSError, RuntimeError), match=error):
        build(template)
    assert len(made) == 1 and not os.path.exists(made[0])
    assert getattr(template, "_dynaresize_vllm_dir", None) is None  # the next start writes anew
