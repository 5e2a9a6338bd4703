"""The exact combine of a model above `COMBINE_BUDGET_BYTES` (one-row blocks) broadcasts each
row from the rank that holds it instead of all-reducing it against zeros: on a spawned 2-rank
gloo world, the sum is bitwise the all-reduce path's (and `ordered_sum` of the rows) on both
ranks, and no held gradient outlives it."""

from __future__ import annotations

from pathlib import Path

import torch
from gloo_jobs import end_rank, file_store, init_gloo, run_jobs

NUM_PARAMS, ROWS = 5000, [0, 1, 2, 4, 5]
HOLDER = {0: 1, 1: 0, 2: 0, 4: 1, 5: 1}
"""Row -> the rank that holds it (uneven, out of order)."""


def grads() -> dict[int, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {m: torch.randn(NUM_PARAMS, generator=gen) * 10 ** (m % 4) for m in ROWS}


def worker(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from dynaresize.train import combine

    init_gloo(rank, 2, store)
    combine.BROADCAST_CHUNK = 1234  # several pieces, the last a short one
    combine.COMBINE_BUDGET_BYTES = 4 * NUM_PARAMS  # one row per block, as for a 135M model
    results = []
    for holders in (HOLDER, None):  # broadcast, then the all-reduce path
        mine = {m: g for m, g in grads().items() if HOLDER[m] == rank}
        results.append(combine.sum_rows(ROWS, mine, NUM_PARAMS, dist.group.WORLD,
                                        torch.device("cpu"), holders))
        assert mine == {}
    torch.save(results, Path(out) / f"rank{rank}.pt")
    end_rank()


def test_broadcast_combine_is_bitwise_the_all_reduce(tmp_path: Path) -> None:
    from dynaresize.train.held import ordered_sum

    run_jobs([(worker, 2, (file_store(tmp_path, "combine"), str(tmp_path)))], 120.0,
             "the 2-rank combine")
    expect = ordered_sum(torch.stack([grads()[m] for m in ROWS]))
    for rank in (0, 1):
        broadcast, all_reduced = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(broadcast, all_reduced) and torch.equal(broadcast, expect)
