"""Published weights as they travel through Ray's object store, without extra copies.

A torch tensor returned from a Ray task is pickled in-band: the publishing trainer holds its
state dict and the pickle's bytes at once, and every receiver deserialises a private copy
(0.54 GB each for SmolLM2-135M). A numpy array goes out-of-band: it is written once into the
shared object store, and `ray.get` (or a task argument) gives a read-only view of those
shared pages. So a publisher sends `to_wire(state)`: zero-copy numpy views of its CPU tensors
whose dtype numpy has (others, e.g. bfloat16 or CUDA tensors, stay tensors); a receiver turns
what it gets back into tensors with `from_wire`, again without copying (an engine's
`load_state_dict` then copies into its own parameters; the evaluation worker assigns them,
so it reads the shared pages). A tensor shared by two keys (tied embeddings) is sent once and
comes back as one tensor under both keys. The bytes are the same either way.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from dynaresize.train.state import once_per_object

NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32,
                torch.int16, torch.int8, torch.uint8, torch.bool)
"""Tensor dtypes that go out-of-band as numpy arrays (numpy has no bfloat16)."""


def to_wire(state: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`state` with every CPU tensor of a numpy dtype as a zero-copy numpy view (one view per
    tensor object, so tied entries stay one object); everything else unchanged. None (a
    trainer that is not its group's rank 0) stays None."""
    if state is None:
        return None
    return once_per_object(state, lambda t: t.detach().numpy(), _numpy_ready)


def _numpy_ready(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" \
        and value.dtype in NUMPY_DTYPES


def from_wire(state: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Tensors again (zero-copy: a read-only array from the object store stays read-only
    memory, so callers copy from it or only read it); one tensor per array object."""
    if state is None:
        return None
    with warnings.catch_warnings():  # "The given NumPy array is not writable": read only
        warnings.simplefilter("ignore", UserWarning)
        return once_per_object(state, torch.from_numpy,
                               lambda value: isinstance(value, np.ndarray))
