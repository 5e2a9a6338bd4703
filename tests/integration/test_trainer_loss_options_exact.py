"""Every `[train.loss]` option with exact reduction: BITWISE the same parameters after 2 steps
on 1, 2 and 3 training ranks (round-robin micro-batches, which split GRPO groups across
ranks), and with the balanced plan (token-budgeted micro-batches, sparse slots) on 1 and 3.
The sequence/group/constant normalisers are functions of the whole batch (summed statistics),
applied once after the index-ordered sum, so no layout can change them.

One spawned 3-rank gloo world (file store, one torch thread per process), groups {0,1,2},
{1,2} and {0}; every run starts from the same version-0 model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_jobs import file_store, init_gloo, run_jobs
from test_trainer_dist import CONFIG, make_model, make_samples

from dynaresize.config import LossConfig

EXACT = dataclasses.replace(CONFIG, exact_reduction=True)
OPTIONS = {
    "clip_higher": LossConfig(clip_low=0.2, clip_high=0.28),
    "sequence": LossConfig(aggregation="sequence"),
    "group": LossConfig(aggregation="group"),
    "dr_grpo": LossConfig(aggregation="constant", advantage="dr-grpo"),
    "gspo": LossConfig(ratio="sequence", aggregation="sequence", clip_low=3e-4,
                       clip_high=4e-4),
    "kl_k1": LossConfig(kl_estimator="k1"),
    "kl_k2_entropy": LossConfig(kl_estimator="k2", entropy_coef=0.01),
}
"""(Dr. GRPO's advantages and the overlong shaping act on the samples' advantages, before
the trainer: covered by tests/unit/test_loss_options.py.)"""
NUM_STEPS = 2
MAX_TOKENS = 20
MAX_NEW_TOKENS = 9
JOB_TIMEOUT_S = 300.0


def samples_of(step: int) -> list:
    """`make_samples` with each sample's group token count (what core.samples sets)."""
    samples = make_samples(step)
    totals: dict[int, int] = {}
    for s in samples:
        totals[s.prompt] = totals.get(s.prompt, 0) + len(s.response_tokens)
    return [dataclasses.replace(s, group_tokens=totals[s.prompt]) for s in samples]


def run(name: str, group, group_rank: int, num_ranks: int, generation: int,
        max_tokens: int = 0) -> str:
    from dynaresize.train import FSDPTrainer, global_num_tokens, plan_step

    cfg = dataclasses.replace(EXACT, loss=OPTIONS[name])
    trainer = FSDPTrainer(make_model, cfg, group, generation, max_new_tokens=MAX_NEW_TOKENS)
    for step in range(NUM_STEPS):
        samples = samples_of(step)
        plan = plan_step(samples, cfg.micro_batch_size, num_ranks, max_tokens)
        trainer.train_step(plan[group_rank], global_num_tokens(samples))
    return trainer.param_checksum()


def scenario(rank: int, out: Path) -> None:
    groups = {m: dist.new_group(list(m)) for m in ((0, 1, 2), (1, 2), (0,))}
    record: dict = {}
    generation = 0
    for name in OPTIONS:
        generation += 10
        record[(name, 3)] = run(name, groups[(0, 1, 2)], rank, 3, generation)
        record[(name, "balanced", 3)] = run(name, groups[(0, 1, 2)], rank, 3, generation + 1,
                                            MAX_TOKENS)
        if rank in (1, 2):
            record[(name, 2)] = run(name, groups[(1, 2)], rank - 1, 2, generation + 2)
        else:
            record[(name, 1)] = run(name, groups[(0,)], 0, 1, generation + 3)
            record[(name, "balanced", 1)] = run(name, groups[(0,)], 0, 1, generation + 4,
                                                MAX_TOKENS)
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
    out = tmp_path_factory.mktemp("trainer_loss_options")
    run_jobs([(worker, 3, (3, file_store(out, "loss"), str(out)))], JOB_TIMEOUT_S,
             "distributed loss-options job")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(3)]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_each_loss_option_gives_the_same_bits_on_1_2_and_3_ranks(results: list[dict],
                                                                 name: str) -> None:
    one = results[0][(name, 1)]
    assert [r[(name, 3)] for r in results] == [one] * 3
    assert [results[1][(name, 2)], results[2][(name, 2)]] == [one] * 2
    balanced = results[0][(name, "balanced", 1)]
    assert [r[(name, "balanced", 3)] for r in results] == [balanced] * 3


def test_the_options_change_the_update(results: list[dict]) -> None:
    """Each option trains other parameters than the others (none is silently ignored)."""
    checksums = [results[0][(name, 1)] for name in OPTIONS]
    assert len(set(checksums)) == len(OPTIONS)
