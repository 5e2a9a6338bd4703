"""Hand a memory-mapped model's file pages back to the page cache (Linux, no torch import).

A `model.source`/`model.path` model is loaded memory-mapped from its safetensors file: its
parameters are pages of a private file mapping. Once a device has copied the version-0
template into its engine or trainer, those pages need not stay in its resident memory:
`drop_file_pages` unmaps them from the process (`madvise(MADV_DONTNEED)`); the mapping stays
valid and the next read of the template faults the same bytes back in from the page cache
(or the file). Only a mapping that is still all clean file pages is touched (no anonymous,
copy-on-write page in it), so no byte of any tensor can change. Anything else (a randomly
initialised model, another libc, another OS) is left alone.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MADV_DONTNEED = 4
SUFFIX = ".safetensors"


def clean_file_regions(smaps: str, suffix: str = SUFFIX) -> list[tuple[int, int]]:
    """(start, end) of each mapping in `smaps` (/proc/PID/smaps text) of a file whose name
    ends with `suffix` and that holds no anonymous (copy-on-write) page."""
    out: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for line in smaps.splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header
            current = None
            if len(fields) >= 6 and fields[5].endswith(suffix):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                current = (start, end)
        elif current is not None and fields[:1] == ["Anonymous:"]:
            if int(fields[1]) == 0:
                out.append(current)
            current = None
    return out


@functools.cache
def _madvise() -> Any:
    try:
        fn = ctypes.CDLL("libc.so.6", use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


def drop_file_pages(addresses: Iterable[int]) -> int:
    """Unmap from this process the pages of every clean safetensors mapping that holds one
    of `addresses` (e.g. a model's parameters' `data_ptr()`); returns the bytes advised
    (0: none, or not Linux/glibc)."""
    smaps = Path("/proc/self/smaps")
    madvise = _madvise()
    if madvise is None or not smaps.exists():
        return 0
    points = list(addresses)
    regions = clean_file_regions(smaps.read_text())
    wanted = {r for r in regions for a in points if r[0] <= a < r[1]}
    done = 0
    for start, end in sorted(wanted):
        if madvise(start, end - start, MADV_DONTNEED) == 0:
            done += end - start
    return done


def drop_model_file_pages(model: Any) -> int:
    """`drop_file_pages` for a torch model's parameters (a no-op for one that is not
    memory-mapped from a safetensors file)."""
    return drop_file_pages({p.data_ptr() for p in model.parameters()})
