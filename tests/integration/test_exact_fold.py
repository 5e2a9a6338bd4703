"""The exact path's fold (`train.exact.HeldGradients.fold`): a rank that holds the step's first
micro-batches keeps them as ONE [P] tensor, g_0 + g_1 + ..., the backward adding each new
gradient straight into it. On a spawned 1-rank gloo world (the trainer needs a group), the fold
after micro-batches arriving in order, out of order, or partly through `put_holdings`, is
bitwise the left fold of the gradients computed independently here (a plain copy of the
model, one backward each, flattened, -0.0 made +0.0), and the step's update equals the one a
2-rank layout would make (test_trainer_dist_exact checks the layouts against each other)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_jobs import end_rank, file_store, init_gloo, run_jobs
from test_trainer_dist import CONFIG, make_model, make_samples

EXACT = dataclasses.replace(CONFIG, exact_reduction=True)


def independent_gradients(micro_batches: list) -> list[torch.Tensor]:
    """Each micro-batch's flat gradient of its loss sum, as the exact path defines it."""
    from dynaresize.train.forward import loss_spec, micro_batch_loss

    model = make_model().train()
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    spec = loss_spec(EXACT, 1.0, 0, 0)
    out = []
    for micro_batch in micro_batches:
        model.zero_grad(set_to_none=True)
        loss_sum, _ = micro_batch_loss(model, reference, micro_batch, spec, torch.device("cpu"))
        loss_sum.backward()
        flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else
                          torch.zeros(p.numel()) for p in model.parameters()])
        flat[flat == 0] = 0.0
        out.append(flat)
    return out


def failures(batches: list) -> list[str]:
    """A micro-batch that fails before its backward leaves every holding as it was; a backward
    that stops midway on the fold's next index drops the holdings (the fold may hold part of
    it) instead of keeping a wrong sum."""
    from dynaresize.train import FSDPTrainer

    problems = []
    trainer = FSDPTrainer(make_model, EXACT, dist.group.WORLD, generation=3)
    trainer.accumulate(0, [(0, batches[0]), (2, batches[2])])
    bad = [dataclasses.replace(batches[1][0], behavior_logprobs=[])]  # pack() refuses it
    try:
        trainer.accumulate(0, [(1, bad)])
        problems.append("a bad micro-batch was accepted")
    except ValueError:
        pass
    held = trainer.exact.held
    if held is None or held.indices() != [0, 2] or held.folded != 1:
        problems.append("a failure before the backward changed the holdings")
    param = next(trainer.exact.replica.parameters())
    hook = param.register_hook(lambda grad: (_ for _ in ()).throw(RuntimeError("stop")))
    try:
        trainer.accumulate(0, [(1, batches[1])])
        problems.append("the stopped backward did not raise")
    except RuntimeError:
        pass
    hook.remove()
    if trainer.exact.held is not None:
        problems.append("a backward stopped inside the fold kept the holdings")
    return problems


def worker(rank: int, store: str, out: str) -> None:
    from dynaresize.train import FSDPTrainer, make_micro_batches
    from dynaresize.train.held import ordered_sum

    init_gloo(rank, 1, store)
    batches = make_micro_batches(make_samples(0), EXACT.micro_batch_size)[:4]
    expect = ordered_sum(torch.stack(independent_gradients(batches)))
    problems = []
    for order in ([0, 1, 2, 3], [2, 0, 3, 1], [3, 2, 1, 0]):
        trainer = FSDPTrainer(make_model, EXACT, dist.group.WORLD, generation=1)
        for m in order:
            trainer.accumulate(0, [(m, batches[m])])
        held = trainer.take_holdings()
        if held.folded != 4 or list(held.grads) != [0] or held.indices() != [0, 1, 2, 3]:
            problems.append(f"{order}: folded {held.folded}, tensors {list(held.grads)}")
        if not torch.equal(held.grads[0], expect):
            problems.append(f"{order}: the fold differs from the ordered sum")
    moved = FSDPTrainer(make_model, EXACT, dist.group.WORLD, generation=2)
    moved.accumulate(0, [(1, batches[1]), (3, batches[3])])  # 1 and 3 wait for 0
    other = moved.take_holdings()
    moved.accumulate(0, [(0, batches[0]), (2, batches[2])])
    moved.put_holdings(other)  # 0, 2 held; 1, 3 arrive: all four fold
    held = moved.take_holdings()
    if held.folded != 4 or not torch.equal(held.grads[0], expect):
        problems.append("put_holdings: not folded to the ordered sum")
    problems += failures(batches)
    (Path(out) / "problems.txt").write_text("\n".join(problems))
    end_rank()


def test_fold_is_the_ordered_sum(tmp_path: Path) -> None:
    run_jobs([(worker, 1, (file_store(tmp_path, "fold"), str(tmp_path)))], 120.0, "the fold")
    assert (tmp_path / "problems.txt").read_text() == ""
