"""The exact combine all-reduces held gradients in row blocks of at most COMBINE_BUDGET_BYTES:
the same adds in the same order as one [M, P] buffer, so the same bits, in bounded memory."""

from __future__ import annotations

import pytest
import torch

from dynaresize.train import combine
from dynaresize.train.held import ordered_sum


@pytest.mark.parametrize("budget_rows", [1, 3, 100])
def test_blocked_combine_is_bitwise_one_buffer(group: object, budget_rows: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    num_params, rows = 1000, [0, 2, 3, 5, 6, 9, 11]
    gen = torch.Generator().manual_seed(5)
    grads = {m: torch.randn(num_params, generator=gen) * 10 ** (m % 4) for m in rows}
    # 5: held elsewhere; clones, since the combine consumes the held tensors
    held = {m: g.clone() for m, g in grads.items() if m != 5}
    monkeypatch.setattr(combine, "COMBINE_BUDGET_BYTES", budget_rows * 4 * num_params)
    got = combine.sum_rows(rows, held, num_params, group, torch.device("cpu"))  # type: ignore[arg-type]
    expect = ordered_sum(torch.stack([grads[m] if m != 5 else torch.zeros(num_params)
                                            for m in rows]))
    assert torch.equal(got, expect)
    assert held == {}  # consumed: no held gradient outlives the combine
