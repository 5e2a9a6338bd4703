"""Exact reduction (`TrainConfig.exact_reduction`): an update that is bitwise the same whatever
the number of training ranks and whichever rank computed which micro-batch.

Why: FSDP sums a rank's micro-batches into its gradient first and reduce-scatters across ranks
after, so the order of the float additions depends on the layout and the update differs by
rounding (~1e-6); a run whose layout changes at runtime (timing-driven resizes) then ends with
other parameters than a run with the same seed. Here the FSDP2 model is only the *storage* of
parameters and AdamW state (dim-0 shards, what resharding and checkpoints use), and:

1. `accumulate` (LOCAL): the gradient g_m of micro-batch m's loss sum is taken on a plain,
   unsharded replica of the model holding the current full parameters, as one fp32 vector [P]
   (parameters in `named_parameters()` order; the replica's grads are views of it and the
   backward adds into zeros, which turns -0.0 into +0.0), and held with the micro-batch's
   float64 statistics under its global index m (`held.HeldGradients`). The same code on the
   same inputs gives the same bits on any rank (all ranks must use the same torch thread
   count, as the rollout devices do). A rank that holds index 0 folds the indices that follow
   it in order into that one vector (the backward adds g_m straight into g_0 + ... + g_{m-1}):
   these are the first adds of point 2's sum, the same operations, so the same bits.
2. `combine` (COLLECTIVE): an all-reduce SUM of an [M, P] buffer in which exactly one rank
   filled each row: x + 0 + ... + 0 == x exactly in any order, so every rank gets every g_m
   bitwise. Then g_0 + g_1 + ... + g_{M-1} in index order, / the global token count, float64
   norm, clip: the same operations on the same values on every rank, for every layout.
3. `write_grads`: each rank's dim-0 rows of the full gradient become its DTensor grads and
   torch's AdamW (foreach=False) steps the shards. AdamW is elementwise; measured (CPU, AVX2
   and default kernels) an element's result does not depend on where it sits in its tensor
   (vectorised body or scalar tail), so any dim-0 sharding updates bitwise like the full
   tensor; tests/unit/test_exact_adamw.py checks that on the machine running the tests.
4. `sync` (COLLECTIVE): the replica's parameters are re-gathered from the new shards (exact);
   on a group of one rank the replica's parameters share the shards' storage instead (no copy).

Cost: every rank holds the full parameters (replica, on one rank the shards themselves; the
KL reference too when kl_coef > 0, unsharded) and its own micro-batches' gradients (fp32, [P]
each, until the step's combine; a fold, however many micro-batches it holds, is one [P]: a
single training rank holds one gradient whatever the number of micro-batches, when they
come in order). The combine consumes them (`train.combine`): a one-row block (a model above
the budget) is broadcast from the rank that holds it and the first row becomes the [P] sum,
which the grads are views of; blocks of several rows (small models) take a buffer of at most
`COMBINE_BUDGET_BYTES`. Meant for small models (CPU).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from dynaresize.resize.reshard import shard_rows
from dynaresize.train.batching import MicroBatch
from dynaresize.train.combine import check_holdings, sum_rows
from dynaresize.train.forward import NUM_STATS, LossSpec, micro_batch_loss
from dynaresize.train.held import HeldGradients, ordered_sum


class ExactReducer:
    """The exact update path of one `FSDPTrainer` (module docstring): the replica, this rank's
    held gradients, the combine. `sharded` is the FSDP2 model the trainer stores state in."""

    def __init__(self, replica: nn.Module, reference: nn.Module | None, sharded: nn.Module,
                 group: dist.ProcessGroup, spec: LossSpec, device: torch.device) -> None:
        self.replica = replica.to(device).train()
        self.reference = reference.to(device).eval() if reference is not None else None
        if self.reference is not None:
            self.reference.requires_grad_(False)
        self.group = group
        self.spec = spec
        self.device = device
        named = list(replica.named_parameters())  # tied parameters once
        self._sharded = list(sharded.named_parameters())
        if [n for n, _ in named] != [n for n, _ in self._sharded]:
            raise ValueError("the replica's parameters differ from the sharded model's")
        self._params = [p for _, p in named]
        self.num_params = sum(p.numel() for p in self._params)
        self.layout = hashlib.sha256(repr([(n, tuple(p.shape)) for n, p in named]).encode()
                                     ).hexdigest()[:16]
        self.shared = dist.get_world_size(group) == 1
        """One rank: the replica's parameters ARE the shards (each shard the whole tensor), not
        a second copy; `sync` re-points them instead of copying."""
        self.fresh = True
        """The replica holds the shards' current values (False after outside writes)."""
        self.held: HeldGradients | None = None
        if self.shared:
            self.sync()

    # ------------------------------------------------------------------ local
    def accumulate(self, step: int, items: list[tuple[int, MicroBatch]],
                   optimizer_step: int) -> None:
        """Compute and hold g_m for each (m, micro-batch). Local; raises before computing
        anything if an item is bad or held already."""
        if not self.fresh:
            raise RuntimeError("the trainer's parameters were written from outside since its "
                               "replica was gathered; call sync_replica() (collective) first")
        if self.held is not None and self.held.step != step:
            raise ValueError(f"gradients of step {self.held.step} are held; finish or "
                             f"take_holdings() before accumulating step {step}")
        if self.held is not None and self.held.optimizer_step != optimizer_step:
            raise ValueError(f"gradients held here were taken at optimizer step "
                             f"{self.held.optimizer_step}, the parameters are at "
                             f"{optimizer_step}; take_holdings() to drop them")
        indices = [m for m, _ in items]
        held = set(self.held.indices()) if self.held is not None else set()
        for m, micro_batch in items:
            if not isinstance(m, int) or m < 0:
                raise ValueError(f"micro-batch index must be an int >= 0, got {m!r}")
            if not micro_batch:
                raise ValueError(f"micro-batch {m} is empty")
        twice = sorted({m for m in indices if indices.count(m) > 1 or m in held})
        if twice:
            raise ValueError(f"step {step}: micro-batch(es) {twice} are held already here")
        if not items:
            return
        if self.held is None:
            self.held = HeldGradients(step, optimizer_step, self.layout)
        for m, micro_batch in items:
            t0 = time.perf_counter()
            held_now = self.held
            into = held_now.grads[0] if held_now.folded and m == held_now.folded else None
            loss_sum, stats = micro_batch_loss(self.replica, self.reference, micro_batch,
                                               self.spec, self.device)  # nothing held changes
            try:
                grad = self._backward(loss_sum, into)
            except BaseException:
                if into is not None:  # stopped midway: the fold may hold part of g_m
                    self.held = None
                raise
            held_now.stats[m] = stats
            if into is None:
                held_now.grads[m] = grad
            else:  # taken straight into the fold: g_m never whole on its own
                held_now.folded += 1
            held_now.fold()
            held_now.compute_s += time.perf_counter() - t0

    def _backward(self, loss_sum: torch.Tensor, into: torch.Tensor | None = None
                  ) -> torch.Tensor:
        """The flat [P] gradient of `loss_sum` (a micro-batch's, on the replica). The backward
        adds each parameter's gradient into its slice of one flat vector (the replica's
        grads are views of it, autograd accumulates in place): zeros (`into` None), so
        the result is g with -0.0 made +0.0 (0.0 + -0.0), which a sum with other ranks'
        zeros would flip otherwise; or `into`, the held fold, which becomes fold + g_m,
        the same add the combine would do (the fold never holds -0.0, and x + -0.0 == x
        + 0.0 for any other x). Never a second [P] copy."""
        flat = into if into is not None else torch.zeros(
            self.num_params, dtype=torch.float32, device=self.device)
        offset = 0
        for p in self._params:
            p.grad = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        try:
            loss_sum.backward()
            offset = 0
            for p in self._params:  # autograd kept them (dense, contiguous, no grad mode)
                if p.grad is None or p.grad.data_ptr() != flat[offset:].data_ptr():
                    raise RuntimeError("autograd did not accumulate into the flat gradient")
                offset += p.numel()
        finally:
            self.replica.zero_grad(set_to_none=True)  # drops the views, not their values
        return flat

    def take(self) -> HeldGradients | None:
        held, self.held = self.held, None
        return held

    def put(self, held: HeldGradients | None, optimizer_step: int) -> None:
        """Merge `held` into this rank's holdings (same step, disjoint indices). Its tensors
        become this rank's (not copied; a fold may add into them): the caller must not use
        `held` again."""
        if held is None:
            return
        if held.layout != self.layout:
            raise ValueError("held gradients belong to a model with other parameters")
        if held.optimizer_step != optimizer_step:
            raise ValueError(f"held gradients were taken at optimizer step "
                             f"{held.optimizer_step}, the parameters are at {optimizer_step}")
        if self.held is None:
            self.held = HeldGradients(held.step, held.optimizer_step, held.layout)
        elif self.held.step != held.step:
            raise ValueError(f"gradients of step {self.held.step} are held here, "
                             f"cannot add step {held.step}")
        both = sorted(set(self.held.indices()) & set(held.indices()))
        if both:
            raise ValueError(f"micro-batch(es) {both} are held twice")
        for m in held.grads:
            self.held.grads[m] = held.grads[m].to(self.device)
        for m in held.stats:
            self.held.stats[m] = held.stats[m].to(self.device)
        self.held.folded = max(self.held.folded, held.folded)  # disjoint: one of them is 0
        self.held.fold()
        self.held.compute_s += held.compute_s

    # ------------------------------------------------------------------ collective
    def combine(self, step: int, num_micro_batches: int, optimizer_step: int,
                num_tokens: int | None = None,
                check_stats: Callable[[torch.Tensor], None] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Collective: (sum of the held g_m [P] fp32, summed stats float64 [NUM_STATS]), in index
        order and identical on every rank; ValueError on every rank if a micro-batch is held
        by several ranks, holdings are of another step, or an index is held by no rank --
        unless `num_tokens` is given and the held micro-batches hold exactly that many
        response tokens: then the indices held by none are empty slots (the balanced plan's
        sparse indices, `balance.slot_index`) and are skipped (adding only the rows that
        exist, in index order, gives the bits a dense numbering of them would).
        `check_stats(summed stats)` may raise too, on every rank alike, before any gradient is
        touched. Past the checks the held gradients are CONSUMED (their tensors become the
        all-reduce buffers and the sum, not copied): the holdings are empty afterwards."""
        m_count, held = num_micro_batches, self.held
        flags = torch.zeros(2 * m_count + 5, dtype=torch.int64, device=self.device)
        if held is not None:
            me = dist.get_rank(self.group) + 1
            for m in held.indices():
                flags[min(m, m_count)] += 1
                if m < m_count:  # who holds m (group rank + 1), once the checks pass
                    flags[m_count + 4 + m] += me
            flags[m_count + 1] = int(held.step != step)
            flags[m_count + 2] = int(held.optimizer_step != optimizer_step)
            flags[m_count + 3] = sum(int(held.stats[m][2]) for m in held.indices())
            flags[2 * m_count + 4] = held.folded  # one rank at most folds (it holds index 0)
        dist.all_reduce(flags, group=self.group)
        counts = flags.tolist()
        gaps_ok = num_tokens is not None and counts[m_count + 3] == num_tokens
        check_holdings(counts, step, m_count, gaps_ok)
        rows = [m for m in range(m_count) if counts[m]]
        row_of = {m: i for i, m in enumerate(rows)}
        stats = torch.zeros(len(rows), NUM_STATS, dtype=torch.float64, device=self.device)
        for m in held.indices() if held is not None else ():
            stats[row_of[m]] = held.stats[m]
        dist.all_reduce(stats, group=self.group)
        total_stats = ordered_sum(stats)
        if check_stats is not None:
            check_stats(total_stats)
        holders = {m: counts[m_count + 4 + m] - 1 for m in rows}
        folded = counts[2 * m_count + 4]  # rows 1 .. folded - 1 are inside row 0 already
        summed = [m for m in rows if m == 0 or m >= folded]
        held_grads = held.grads if held is not None else {}
        return sum_rows(summed, held_grads, self.num_params, self.group, self.device,
                        holders), total_stats

    def write_grads(self, grad: torch.Tensor) -> None:
        """Local: each sharded parameter's grad = this rank's dim-0 rows of the full `grad`, as
        views of it (no copy: `grad` stays alive until the grads are set to None)."""
        offset = 0
        with torch.no_grad():
            for name, param in self._sharded:
                full = grad[offset:offset + param.numel()].view(param.shape)
                offset += param.numel()
                if not isinstance(param, DTensor):
                    param.grad = full
                    continue
                mesh = param.device_mesh
                start, stop = shard_rows(param.shape[0], mesh.size(), mesh.get_local_rank())
                local = param.to_local()
                assert local.shape[0] == stop - start, f"{name}: unexpected shard rows"
                param.grad = DTensor.from_local(full[start:stop], mesh, param.placements,
                                                run_check=False, shape=param.shape,
                                                stride=param.stride())

    def sync(self) -> None:
        """Collective: the replica's parameters <- the full current (sharded) parameters."""
        with torch.no_grad():
            for (_, param), mine in zip(self._sharded, self._params, strict=True):
                if self.shared:  # the same storage: the replica reads what AdamW wrote
                    local = param.to_local() if isinstance(param, DTensor) else param
                    assert local.shape == mine.shape, "one rank's shard is the whole tensor"
                    mine.data = local.detach()
                else:
                    mine.copy_(param.full_tensor() if isinstance(param, DTensor) else param)
        self.fresh = True
