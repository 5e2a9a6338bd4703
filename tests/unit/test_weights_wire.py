"""Published weights travel as zero-copy numpy views (`devices.weights_wire`): the same
bytes back, tied entries one tensor, what numpy cannot hold left a tensor."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from dynaresize.devices.weights_wire import from_wire, to_wire


def test_the_same_bytes_come_back_and_tied_entries_stay_one_tensor() -> None:
    torch.manual_seed(0)
    emb = torch.randn(50, 8)
    state = {"embed.weight": emb, "lm_head.weight": emb, "norm.weight": torch.randn(8),
             "steps": torch.tensor(3), "half": torch.randn(4).bfloat16()}
    wire = to_wire(state)
    assert wire is not None
    assert isinstance(wire["embed.weight"], np.ndarray)
    assert wire["embed.weight"] is wire["lm_head.weight"]  # sent once
    assert isinstance(wire["half"], torch.Tensor)  # numpy has no bfloat16
    # as Ray's object store carries it: pickle protocol 5, arrays out-of-band
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(wire, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 3  # embed (once), norm, steps: not in the pickle's bytes
    back = from_wire(pickle.loads(data, buffers=buffers))
    assert back is not None and back.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(back[key], value) and back[key].dtype == value.dtype
    assert back["embed.weight"] is back["lm_head.weight"]


def test_a_view_shares_the_tensor_memory_and_none_passes() -> None:
    t = torch.arange(6, dtype=torch.float32)
    wire = to_wire({"w": t})
    assert wire is not None
    t[0] = 42.0  # a view, not a copy
    assert wire["w"][0] == 42.0
    assert from_wire(None) is None and to_wire(None) is None
