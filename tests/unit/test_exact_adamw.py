"""The exact path's premise (`train.exact`, point 3): torch's AdamW (foreach=False) updates an
element the same, bit for bit, wherever the element sits in its tensor, so stepping FSDP2's
dim-0 shards of any layout equals stepping the full tensor. Checked here on this machine's
kernels, for sizes that leave vectorised loops with scalar tails at odd offsets (e.g. a norm
weight of 64 over 3 ranks: 22, 22, 20)."""

from __future__ import annotations

import pytest
import torch

from dynaresize.resize.reshard import shard_rows
from dynaresize.train.held import ordered_sum, scale_and_clip_

SHAPES = [(64,), (32,), (17,), (4099,), (37, 64), (128, 64), (32, 63)]


def adamw(params: list[torch.Tensor], grads: list[list[torch.Tensor]], weight_decay: float
          ) -> list[torch.Tensor]:
    live = [torch.nn.Parameter(p.clone()) for p in params]
    optimizer = torch.optim.AdamW(live, lr=3e-3, weight_decay=weight_decay, foreach=False)
    for step_grads in grads:
        for p, g in zip(live, step_grads, strict=True):
            p.grad = g.clone()
        optimizer.step()
    return [torch.cat([p.detach().reshape(-1), optimizer.state[p]["exp_avg"].reshape(-1),
                       optimizer.state[p]["exp_avg_sq"].reshape(-1)]) for p in live]


def shards(t: torch.Tensor, num_ranks: int) -> list[torch.Tensor]:
    rows = [shard_rows(t.shape[0], num_ranks, r) for r in range(num_ranks)]
    return [t[a:b] for a, b in rows if b > a]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("shape", SHAPES)
def test_adamw_on_dim0_shards_is_bitwise_the_full_update(shape: tuple[int, ...],
                                                          weight_decay: float) -> None:
    g = torch.Generator().manual_seed(sum(shape))
    full = torch.randn(shape, generator=g)
    grads = [torch.randn(shape, generator=g) * 10.0 ** -k for k in range(4)]
    (ref,) = adamw([full], [[x] for x in grads], weight_decay)
    count = ref.numel() // 3
    for num_ranks in (2, 3, 5):
        got = adamw(shards(full, num_ranks), [shards(x, num_ranks) for x in grads],
                    weight_decay)
        for part in range(3):  # parameter, exp_avg, exp_avg_sq
            joined = torch.cat([s[part * (s.numel() // 3):(part + 1) * (s.numel() // 3)]
                                for s in got])
            assert torch.equal(joined, ref[part * count:(part + 1) * count]), (num_ranks, part)


def test_ordered_sum_and_clip() -> None:
    rows = torch.tensor([[1e8, 1.0], [1.0, 2.0], [-1e8, 3.0]])
    assert ordered_sum(rows).tolist() == [0.0, 6.0]  # (1e8 + 1) - 1e8 in float32: index order
    grad = torch.tensor([30.0, 40.0])
    assert scale_and_clip_(grad, 10, 1.0) == pytest.approx(5.0)
    assert torch.allclose(grad, torch.tensor([0.6, 0.8]), atol=1e-6)
    grad = torch.tensor([3.0, 4.0])
    assert scale_and_clip_(grad, 10, 1.0) == pytest.approx(0.5) and grad.tolist() == \
        pytest.approx([0.3, 0.4])


def test_float64_norm_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynaresize.train import held as exact

    gen = torch.Generator().manual_seed(3)
    vector = torch.randn(10_007, generator=gen) * 1e-3
    whole = float(torch.linalg.vector_norm(vector, dtype=torch.float64))
    monkeypatch.setattr(exact, "NORM_CHUNK", 1000)  # 11 pieces, the last a short one
    pieces = exact.float64_norm(vector)
    assert pieces == pytest.approx(whole, rel=1e-13)  # float64 accumulation: ~1e-16 apart
    assert exact.float64_norm(vector.clone()) == pieces  # a fixed order: the same bits
    assert exact.float64_norm(torch.zeros(0)) == 0.0
