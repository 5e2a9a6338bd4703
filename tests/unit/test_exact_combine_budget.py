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
    got = combine.sum_rows(rows, held, num_params, group,  # type: ignore[arg-type]
                           torch.device("cpu"))
    expect = ordered_sum(torch.stack([grads[m] if m != 5 else torch.zeros(num_params)
                                      for m in rows]))
    assert torch.equal(got, expect)
    assert held == {}  # consumed: no held gradient outlives the combine


def _flags(counts: list[int], over: int = 0, other_step: int = 0, other_params: int = 0
           ) -> list[int]:
    """`check_holdings`' input: per-index holder counts, then the three problem counts."""
    return [*counts, over, other_step, other_params]


def test_holdings_held_once_each_pass_and_every_problem_is_named() -> None:
    combine.check_holdings(_flags([1, 1, 1]), step=3, m_count=3)
    combine.check_holdings(_flags([1, 0, 1]), step=3, m_count=3, gaps_ok=True)  # empty slots
    with pytest.raises(ValueError) as err:
        combine.check_holdings(_flags([1, 0, 2], over=1, other_step=1, other_params=2),
                               step=3, m_count=3)
    message = str(err.value)
    for part in ("finish of step 3", "[1] held by no rank", "{2: 2}",
                 "1 held index(es) >= num_micro_batches = 3",
                 "1 rank(s) hold gradients of another step",
                 "2 rank(s) hold gradients taken at other parameters",
                 "holdings are left as they were"):
        assert part in message, (part, message)
    with pytest.raises(ValueError, match="no micro-batch is held"):
        combine.check_holdings(_flags([0, 0]), step=0, m_count=2, gaps_ok=True)
