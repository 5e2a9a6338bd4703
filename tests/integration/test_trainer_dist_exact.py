"""Exact reduction (`TrainConfig.exact_reduction`, `train.exact`): the same samples give
BITWISE the same parameters (SHA-256) after 3 steps whatever the number of ranks and whichever
rank computed which micro-batch, also when the group changes in the middle of a step.

One spawned 3-rank gloo world (file store, one torch thread per process); every run starts
from the same version-0 model:
  A) group {0,1,2}, `train_step` x 3;
  B) group {1,2}, `train_step` x 3; meanwhile on group {0}: the same exact (the reference)
     and the FSDP path on the same samples (equal to exact within 1e-4 only);
  C) group {0,1}, `accumulate`/`finish` with uneven, out-of-order assignments (one rank holds
     everything in step 1), a finish with a missing and one with a duplicated micro-batch;
  D) group {0,1,2}: step 0, then step 1 accumulated on all three; mid-step the group becomes
     {1,2} (state resharded by `execute_reshard`, holdings moved with take/put, rank 0's to
     rank 1), finish there, step 2.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

# Model, samples and helpers of the FSDP trainer test (sibling module on sys.path, see
# test_reshard_dist.py).
from gloo_jobs import file_store, init_gloo, run_jobs
from test_trainer_dist import CONFIG, make_model, make_samples, max_abs_diff, run_steps

EXACT = dataclasses.replace(CONFIG, exact_reduction=True)
NUM_STEPS = 3
JOB_TIMEOUT_S = 150.0


def step_inputs(step: int) -> tuple[list, int]:
    """(micro-batches of `step` in global index order, global token count)."""
    from dynaresize.train import global_num_tokens, make_micro_batches

    samples = make_samples(step)
    return make_micro_batches(samples, EXACT.micro_batch_size), global_num_tokens(samples)


def errors_of(fn) -> str:
    """The ValueError message `fn()` raises ('' if none)."""
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return ""


def single(group, out: Path) -> None:
    """The one-rank reference, and the FSDP path on the same samples."""
    from dynaresize.train import FSDPTrainer

    trainer = FSDPTrainer(make_model, EXACT, group, generation=10)
    metrics = run_steps(trainer, range(NUM_STEPS), 0, 1)
    fsdp = FSDPTrainer(make_model, CONFIG, group, generation=11)
    fsdp_metrics = run_steps(fsdp, range(NUM_STEPS), 0, 1)
    torch.save({"checksum": trainer.param_checksum(), "sd": trainer.full_state_dict(),
                "metrics": metrics, "fsdp_sd": fsdp.full_state_dict(),
                "fsdp_metrics": fsdp_metrics}, out / "single.pt")


def streamed(rank: int, group) -> dict:
    """C: group {0, 1}, accumulate/finish with odd assignments and two bad finishes."""
    from dynaresize.train import FSDPTrainer

    trainer = FSDPTrainer(make_model, EXACT, group, generation=3)
    me = trainer.rank
    record: dict = {"metrics": []}
    mbs, tokens = step_inputs(0)  # 8 micro-batches: rank 0 {3, 0}, rank 1 {1, 2} first
    trainer.accumulate(0, [(m, mbs[m]) for m in ((3, 0), (1, 2))[me]])
    record["missing"] = errors_of(lambda: trainer.finish(0, len(mbs), tokens))
    record["local_twice"] = errors_of(lambda: trainer.accumulate(0, [((3, 1)[me], mbs[0])]))
    record["other_step"] = errors_of(lambda: trainer.accumulate(5, [(6, mbs[6])]))
    if me == 1:  # holdings survived the failed finish: add the rest, in two calls
        trainer.accumulate(0, [(7, mbs[7]), (5, mbs[5])])
        trainer.accumulate(0, [(4, mbs[4]), (6, mbs[6])])
    record["metrics"].append(trainer.finish(0, len(mbs), tokens))
    mbs, tokens = step_inputs(1)  # rank 0 holds everything; rank 1 also holds 5
    trainer.accumulate(1, [(m, mbs[m]) for m in ((7, 6, 5, 4, 3, 2, 1, 0), (5,))[me]])
    record["twice"] = errors_of(lambda: trainer.finish(1, len(mbs), tokens))
    if me == 1:
        record["taken"] = sorted(trainer.take_holdings().grads)
    record["metrics"].append(trainer.finish(1, len(mbs), tokens))
    mbs, tokens = step_inputs(2)
    mine = ((1, 3, 5, 7), (6, 4, 2, 0))[me]
    trainer.accumulate(2, [(m, mbs[m]) for m in mine[:2]])
    trainer.accumulate(2, [(m, mbs[m]) for m in mine[2:]])
    record["metrics"].append(trainer.finish(2, len(mbs), tokens))
    record["checksum"] = trainer.param_checksum()
    return record


def resized_mid_step(rank: int, groups: dict) -> dict:
    """D: step 1 is accumulated on {0,1,2} and finished on {1,2} (module docstring)."""
    from dynaresize.resize.reshard import plan_reshard
    from dynaresize.train import FSDPTrainer
    from dynaresize.train.reshard_exec import execute_reshard

    old = FSDPTrainer(make_model, EXACT, groups[(0, 1, 2)], generation=4)
    run_steps(old, range(1), rank, 3)
    mbs, tokens = step_inputs(1)
    old.accumulate(1, [(m, mbs[m]) for m in reversed(range(len(mbs))) if m % 3 == rank])
    held = old.take_holdings()
    kept = copy.deepcopy(held)
    new = FSDPTrainer(make_model, EXACT, groups[(1, 2)], generation=5) if rank else None
    plan = plan_reshard(old.full_shapes(), (0, 1, 2), (1, 2), 4096)
    if new is not None:
        new.init_optimizer_state(1)
    execute_reshard(plan, rank, old, new, 1, 4096)
    moved = [held if rank == 0 else None]
    dist.broadcast_object_list(moved, src=0)  # the departing rank's holdings go to rank 1
    record: dict = {}
    if new is not None:
        new.put_holdings(held)
        if rank == 1:
            record["overlap"] = errors_of(lambda: new.put_holdings(held))
            new.put_holdings(moved[0])
        record["metrics"] = [new.finish(1, len(mbs), tokens)]
        record["stale"] = errors_of(lambda: new.put_holdings(kept))  # params moved on
        record["metrics"] += run_steps(new, range(2, NUM_STEPS), new.rank, 2)
        record["checksum"] = new.param_checksum()
    return record


def scenario_world3(rank: int, out: Path) -> None:
    from dynaresize.train import FSDPTrainer

    groups = {m: dist.new_group(list(m)) for m in ((0, 1, 2), (1, 2), (0, 1), (0,))}
    record: dict = {}
    trainer = FSDPTrainer(make_model, EXACT, groups[(0, 1, 2)], generation=1)  # A
    record["A"] = {"metrics": run_steps(trainer, range(NUM_STEPS), rank, 3),
                   "checksum": trainer.param_checksum()}
    del trainer
    if rank in (1, 2):  # B
        trainer = FSDPTrainer(make_model, EXACT, groups[(1, 2)], generation=2)
        record["B"] = {"metrics": run_steps(trainer, range(NUM_STEPS), rank - 1, 2),
                       "checksum": trainer.param_checksum()}
        del trainer
    else:
        single(groups[(0,)], out)
    if rank in (0, 1):  # C
        record["C"] = streamed(rank, groups[(0, 1)])
    record["D"] = resized_mid_step(rank, groups)
    torch.save(record, out / f"world3_rank{rank}.pt")


def worker(rank: int, world_size: int, store: str, out: str) -> None:
    init_gloo(rank, world_size, store)
    try:
        scenario_world3(rank, Path(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trainer_exact")
    run_jobs([(worker, 3, (3, file_store(out, "exact"), str(out)))], JOB_TIMEOUT_S,
             "distributed exact trainer job")
    return out


def load(results: Path, rank: int) -> dict:
    return torch.load(results / f"world3_rank{rank}.pt", weights_only=False)


def test_any_layout_gives_the_same_bits(results: Path) -> None:
    single = torch.load(results / "single.pt", weights_only=False)
    assert max_abs_diff(single["sd"], make_model().state_dict()) > 1e-3  # training moved them
    expected = single["checksum"]
    runs = {"A": (0, 1, 2), "B": (1, 2), "C": (0, 1), "D": (1, 2)}
    for name, ranks in runs.items():
        for rank in ranks:
            assert load(results, rank)[name]["checksum"] == expected, (name, rank)
    for name, ranks in runs.items():  # metrics too, except timings
        for rank in ranks:
            got = load(results, rank)[name]["metrics"]
            for mine, ref in zip(got[-1:], single["metrics"][-1:]):
                assert {k: v for k, v in mine.items() if k != "train_s"} == \
                    {k: v for k, v in ref.items() if k != "train_s"}, (name, rank)


def test_exact_path_computes_the_fsdp_update(results: Path) -> None:
    single = torch.load(results / "single.pt", weights_only=False)
    assert max_abs_diff(single["sd"], single["fsdp_sd"]) < 1e-4
    for exact, fsdp in zip(single["metrics"], single["fsdp_metrics"]):
        for key in ("loss", "grad_norm", "clip_fraction", "tokens", "kl"):
            assert exact[key] == pytest.approx(fsdp[key], rel=1e-5, abs=1e-6)


def test_bad_finishes_fail_on_every_rank_and_keep_holdings(results: Path) -> None:
    c = [load(results, rank)["C"] for rank in (0, 1)]
    assert c[0]["missing"] == c[1]["missing"]
    assert "[4, 5, 6, 7] held by no rank" in c[0]["missing"]
    assert c[0]["twice"] == c[1]["twice"] and "{5: 2}" in c[0]["twice"]
    assert c[1]["taken"] == [5]
    for rec in c:
        assert "held already here" in rec["local_twice"]
        assert "gradients of step 0 are held" in rec["other_step"]
        assert len(rec["metrics"]) == NUM_STEPS


def test_holdings_survive_a_group_change(results: Path) -> None:
    d1, d2 = load(results, 1)["D"], load(results, 2)["D"]
    assert "held twice" in d1["overlap"]
    assert "optimizer step 1" in d1["stale"] and "at 2" in d2["stale"]
    assert "metrics" not in load(results, 0)["D"]
