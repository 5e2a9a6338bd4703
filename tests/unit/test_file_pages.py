"""devices.file_pages: a memory-mapped model's clean file pages leave the process's resident
memory and its tensors keep every byte; anonymous or copy-on-written memory is never touched
(a tiny local safetensors checkpoint; Linux)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_checkpoint import write_tiny_checkpoint  # noqa: E402

from dynaresize.devices.file_pages import (  # noqa: E402
    clean_file_regions,
    drop_file_pages,
    drop_model_file_pages,
)

SMAPS = """\
7f0000000000-7f0000100000 rw-p 00000000 fd:01 42    /m/model.safetensors
Size:               1024 kB
Rss:                1024 kB
Anonymous:             0 kB
VmFlags: rd wr mr mw me ac
7f0000200000-7f0000300000 rw-p 00000000 fd:01 43    /m/other.safetensors
Rss:                1024 kB
Anonymous:             4 kB
7f0000400000-7f0000500000 rw-p 00000000 00:00 0
Anonymous:             0 kB
7f0000600000-7f0000700000 r--p 00000000 fd:01 44    /m/model.bin
Anonymous:             0 kB
"""


def test_only_clean_safetensors_mappings_are_candidates() -> None:
    assert clean_file_regions(SMAPS) == [(0x7F0000000000, 0x7F0000100000)]
    assert clean_file_regions(SMAPS, ".bin") == [(0x7F0000600000, 0x7F0000700000)]


def _mapped_model(tmp_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(write_tiny_checkpoint(tmp_path),
                                                local_files_only=True)


def _region_rss_kb(model: Any) -> int:
    """Resident kB of the mappings that hold `model`'s parameters."""
    ptrs, total, inside = [p.data_ptr() for p in model.parameters()], 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            inside = any(start <= p < end for p in ptrs)
        elif inside and fields[:1] == ["Rss:"]:
            total += int(fields[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux /proc only")
def test_file_pages_leave_and_every_byte_stays(tmp_path: Path) -> None:
    model = _mapped_model(tmp_path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert _region_rss_kb(model) > 0  # read in by the clone above
    assert drop_model_file_pages(model) > 0
    assert _region_rss_kb(model) == 0
    after = model.state_dict()
    assert all(bool((after[k] == v).all()) for k, v in before.items())  # faulted back in


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux /proc only")
def test_anonymous_and_copy_on_written_memory_is_left_alone(tmp_path: Path) -> None:
    import torch

    anon = torch.arange(1 << 16, dtype=torch.float32)
    assert drop_file_pages([anon.data_ptr()]) == 0 and float(anon[-1]) == (1 << 16) - 1
    model = _mapped_model(tmp_path)
    param = next(model.parameters())
    with torch.no_grad():
        param.add_(1.0)  # a private copy of those pages: the mapping is no longer clean
    want = param.detach().clone()
    assert drop_model_file_pages(model) == 0
    assert bool((param == want).all())
