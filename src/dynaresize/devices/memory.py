"""Process memory of a device actor (and the evaluation worker): freed pages handed back to
the OS, dropped trainers and engines collected, models cloned without a second
initialisation. None of it changes a result."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    """glibc's `malloc_trim`, or None (another libc)."""
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """Hand the pages glibc's allocator holds free back to the OS (`malloc_trim`): after a
    step the freed activations and gradients would otherwise stay in this process's resident
    memory. No effect on any result; a no-op without glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def release_dropped() -> None:
    """After dropping a trainer or an engine: collect the reference cycles that keep it alive
    (FSDP's modules and hooks form some: without a collection a dropped trainer's ~2 GB of
    shards, replica and AdamW state would stay until Python's next full collection), then
    `release_free_memory`. No effect on any result."""
    import gc

    gc.collect()
    release_free_memory()


def clone_model(template: Any, blank: bool = False) -> Any:
    """An equal, independent copy of a transformers model: constructed without weight
    initialisation (its buffers are computed as usual), tied, then loaded from the template.
    `blank`: skip the load (parameters uninitialised), for a caller that overwrites them all."""
    import copy

    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = type(template)(copy.deepcopy(template.config))
    model.tie_weights()
    if not blank:
        model.load_state_dict(template.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(template.generation_config)
    return model.to(template.dtype).train(template.training)
