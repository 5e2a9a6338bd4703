"""The balanced plan (`train.max_tokens_per_micro_batch`, `train.balance`) with exact reduction:
BITWISE the same parameters after 3 steps on 1, 2 and 3 training ranks (LPT assigns other
micro-batches to other ranks on each), and when the same micro-batches are streamed
(`accumulate` with their sparse slot indices, in another assignment, then `finish` over the
slot space, as `dynaresize.core.stream` does with a token budget).

One spawned 3-rank gloo world (file store, one torch thread per process), groups {0,1,2},
{1,2}, {0} and {0,1}; every run starts from the same version-0 model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_jobs import file_store, init_gloo, run_jobs
from test_trainer_dist import CONFIG, GROUP_SIZE, NUM_PROMPTS, make_model, make_samples

EXACT = dataclasses.replace(CONFIG, exact_reduction=True)
MAX_TOKENS = 20
"""Groups of ~40 tokens: cut into 2-3 micro-batches each, so the slots are sparse."""
NUM_STEPS = 3
JOB_TIMEOUT_S = 150.0


def balanced_steps(trainer, group_rank: int, num_ranks: int) -> list[dict]:
    from dynaresize.train import global_num_tokens, plan_step

    metrics = []
    for step in range(NUM_STEPS):
        samples = make_samples(step)
        plan = plan_step(samples, EXACT.micro_batch_size, num_ranks, MAX_TOKENS)
        metrics.append(trainer.train_step(plan[group_rank], global_num_tokens(samples)))
    return metrics


def streamed_steps(trainer, group_rank: int) -> dict:
    """The same micro-batches, accumulated out of order (rank 0: odd positions, reversed)."""
    from dynaresize.train import global_num_tokens
    from dynaresize.train.balance import num_slots, token_micro_batches

    record: dict = {"num_micro_batches": [], "slots": []}
    for step in range(NUM_STEPS):
        samples = make_samples(step)
        mbs = token_micro_batches(samples, MAX_TOKENS)
        mine = [mb for i, mb in enumerate(mbs) if i % 2 != group_rank][::-1]
        trainer.accumulate(step, mine)
        trainer.finish(step, num_slots(NUM_PROMPTS, GROUP_SIZE), global_num_tokens(samples))
        record["num_micro_batches"].append(len(mbs))
        record["slots"].append([m for m, _ in mbs])
    record["checksum"] = trainer.param_checksum()
    return record


def scenario(rank: int, out: Path) -> None:
    from dynaresize.train import FSDPTrainer

    groups = {m: dist.new_group(list(m)) for m in ((0, 1, 2), (1, 2), (0,), (0, 1))}
    record: dict = {}
    trainer = FSDPTrainer(make_model, EXACT, groups[(0, 1, 2)], generation=1)
    balanced_steps(trainer, rank, 3)
    record[3] = trainer.param_checksum()
    del trainer
    if rank in (1, 2):
        trainer = FSDPTrainer(make_model, EXACT, groups[(1, 2)], generation=2)
        balanced_steps(trainer, rank - 1, 2)
        record[2] = trainer.param_checksum()
    else:
        trainer = FSDPTrainer(make_model, EXACT, groups[(0,)], generation=3)
        balanced_steps(trainer, 0, 1)
        record[1] = trainer.param_checksum()
    del trainer
    if rank in (0, 1):
        trainer = FSDPTrainer(make_model, EXACT, groups[(0, 1)], generation=4)
        record["streamed"] = streamed_steps(trainer, rank)
    torch.save(record, out / f"rank{rank}.pt")


def worker(rank: int, world_size: int, store: str, out: str) -> None:
    init_gloo(rank, world_size, store)
    try:
        scenario(rank, Path(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("trainer_balanced")
    run_jobs([(worker, 3, (3, file_store(out, "balanced"), str(out)))], JOB_TIMEOUT_S,
             "distributed balanced-plan job")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(3)]


def test_balanced_plan_gives_the_same_bits_on_1_2_and_3_ranks(results: list[dict]) -> None:
    one = results[0][1]
    assert [r[3] for r in results] == [one] * 3
    assert [results[1][2], results[2][2]] == [one] * 2


def test_streamed_token_budgeted_micro_batches_give_the_same_bits(results: list[dict]) -> None:
    streamed = results[0]["streamed"]
    assert streamed["checksum"] == results[1]["streamed"]["checksum"] == results[0][1]
    # the plan really cut groups, and left empty slots the finish skipped
    assert all(n > NUM_PROMPTS for n in streamed["num_micro_batches"])
    assert all(max(slots) + 1 > len(slots) for slots in streamed["slots"])
