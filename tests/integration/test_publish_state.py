"""`FSDPTrainer.publish_state` (what a weight publish serialises): on a spawned 2-rank gloo
world with exact reduction, rank 0 gets the same values as `full_state_dict` (tied weights one
tensor under both keys) as views of its replica, rank 1 None; after the shards were written
from outside (a stale replica) it falls back to the gather, on both ranks alike. One rank: the
replica shares the shards' storage, and the result is still the full state."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_jobs import end_rank, file_store, init_gloo, run_jobs
from test_trainer_dist import CONFIG, make_model, run_steps

EXACT = dataclasses.replace(CONFIG, exact_reduction=True)


def _check(trainer, rank: int, replica_views: bool) -> list[str]:
    """Problems of one publish_state against full_state_dict ([] if none)."""
    expect = trainer.full_state_dict()
    got = trainer.publish_state()
    if rank != 0:
        return [] if got is None and expect is None else ["a non-zero rank got a state"]
    problems = []
    if got.keys() != expect.keys() or any(not torch.equal(got[k], expect[k]) for k in got):
        problems.append("values differ from full_state_dict")
    if got["lm_head.weight"] is not got["model.embed_tokens.weight"]:
        problems.append("tied weights are two tensors")
    replica = {p.data_ptr() for p in trainer.exact.replica.parameters()}
    if (got["model.norm.weight"].data_ptr() in replica) != replica_views:
        problems.append(f"replica views expected: {replica_views}")
    return problems


def worker(rank: int, store: str, out: str) -> None:
    from dynaresize.train import FSDPTrainer

    init_gloo(rank, 2, store)
    problems = []
    trainer = FSDPTrainer(make_model, EXACT, dist.group.WORLD, generation=1)
    problems += _check(trainer, rank, replica_views=True)  # version 0
    run_steps(trainer, range(2), rank, 2)
    problems += _check(trainer, rank, replica_views=True)
    with torch.no_grad():
        for shard in trainer.local_shards().values():  # an outside write: replica stale
            shard.add_(1.0)
    problems += _check(trainer, rank, replica_views=False)
    singles = [dist.new_group([r]) for r in (0, 1)]  # every rank creates every group
    solo = FSDPTrainer(make_model, EXACT, singles[rank], generation=2 + rank)
    run_steps(solo, range(1), 0, 1)
    problems += _check(solo, 0, replica_views=True)
    (Path(out) / f"rank{rank}.txt").write_text("\n".join(problems))
    end_rank()


def test_publish_state_is_the_full_state_without_a_gather(tmp_path: Path) -> None:
    run_jobs([(worker, 2, (file_store(tmp_path, "publish"), str(tmp_path)))], 120.0,
             "the 2-rank publish")
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "", f"rank {rank}"
