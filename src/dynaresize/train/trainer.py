"""FSDP2 trainer over one training group: the only train module that touches process groups.

Consumes: a process group (the training group; may be a subgroup of the world, whose other
ranks are rollout devices and make no call here), a unique `generation` (names the DeviceMesh,
design §6), a factory returning the version-0 model (identical on every rank), a `TrainConfig`.
Produces: one optimizer step per `train_step`, full CPU state on the group's rank 0
(`full_state_dict`, `full_optim_state_dict`), a checksum identical on every rank, and for
resharding (`train.reshard_exec`) the local dim-0 shards (`local_shards`), the full shapes to
plan with (`full_shapes`) and fresh AdamW state at a given step (`init_optimizer_state`); these
three are local calls, not collectives.

The constructor and every public method are COLLECTIVE over the group: all its ranks (and
no other process) call them, in the same order; `train_step` with the same number of
micro-batch rounds on every rank (`batching.plan_step` pads with None for that). Exceptions:
the local calls above, and `accumulate` / `take_holdings` / `put_holdings`.

Two update paths (`TrainConfig.exact_reduction`), the same loss (`train.forward`):
- exact (default, `train.exact`): per-micro-batch gradients on an unsharded replica, combined
  in micro-batch index order: bitwise the same update for any number of ranks and any
  assignment of micro-batches to ranks. Also streams: `accumulate(step, [(m, micro_batch)])`
  (local, whenever micro-batches are ready), then `finish(step, M, tokens)` (collective).
- FSDP: micro-batch loss = loss_sum / global_num_tokens, multiplied by the group size R because
  FSDP averages gradients over R ranks, so the summed update is the gradient of the global
  batch's token-mean loss whatever R, up to float reduction order (design §2.4).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from dynaresize.config import TrainConfig
from dynaresize.train.balance import IndexedMicroBatch
from dynaresize.train.batching import MicroBatch
from dynaresize.train.exact import ExactReducer
from dynaresize.train.forward import (
    NUM_STATS,
    loss_denominator,
    loss_spec,
    micro_batch_loss,
    padding_micro_batch,
)
from dynaresize.train.held import HeldGradients, scale_and_clip_
from dynaresize.train.state import OPTIM_KEYS, ShardedState, checksum_named_tensors

__all__ = ["OPTIM_KEYS", "FSDPTrainer", "checksum_named_tensors"]


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no .model.layers ModuleList to shard")
    return list(layers)


def _shard(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


class FSDPTrainer(ShardedState):
    """GRPO/PPO-clip policy trainer, FSDP2-sharded over `group` (see module docstring)."""

    def __init__(self, model_factory: Callable[[], nn.Module], config: TrainConfig,
                 group: dist.ProcessGroup, generation: int, *,
                 device: torch.device | str = "cpu", temperature: float = 1.0,
                 pad_token_id: int = 0, max_new_tokens: int = 0) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.config = config
        self.group = group
        self.rank = dist.get_rank(group)
        self.num_ranks = dist.get_world_size(group)
        if self.rank < 0:
            raise ValueError("this process is not a member of the training group")
        self.device = torch.device(device)
        self.spec = loss_spec(config, temperature, pad_token_id, max_new_tokens)
        self.mesh = DeviceMesh.from_group(group, self.device.type,
                                          mesh_dim_names=(f"dp{generation}",))
        model = model_factory().to(self.device)
        reference = copy.deepcopy(model) if config.kl_coef > 0 else None
        replica = copy.deepcopy(model) if config.exact_reduction else None
        if replica is not None and config.gradient_checkpointing:  # same values, less memory
            replica.gradient_checkpointing_enable({"use_reentrant": False})
        self.model = _shard(model, self.mesh)
        self.ref_model: nn.Module | None = None
        self.exact: ExactReducer | None = None
        if replica is not None:  # the KL reference stays an unsharded replica too
            self.exact = ExactReducer(replica, reference, self.model, group, self.spec,
                                      self.device)
        elif reference is not None:
            reference.requires_grad_(False)
            self.ref_model = _shard(reference.eval(), self.mesh)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr,
                                           weight_decay=config.weight_decay, foreach=False)

    # ------------------------------------------------------------------ training

    def train_step(self, micro_batches: list[MicroBatch | None],
                   global_num_tokens: int) -> dict[str, float]:
        """Forward/backward this rank's micro-batches (None: padding round), clip, one AdamW
        step. Element k of rank r's list is global micro-batch k * R + r (`batching.deal`), or
        its own `global_index` (`balance.IndexedMicroBatch`, the balanced plan).
        Metrics are global (identical on every rank)."""
        if global_num_tokens <= 0:
            raise ValueError(f"global_num_tokens must be > 0, got {global_num_tokens}")
        t0 = time.perf_counter()
        num_micro_batches, stale = self._check_rounds(micro_batches)
        if self.exact is None:
            return self._fsdp_step(micro_batches, global_num_tokens, t0)
        if stale:
            self.sync_replica()
        step = self.optimizer_step_count()
        mine = [(self._index(k, mb), mb) for k, mb in enumerate(micro_batches) if mb is not None]
        try:
            self.exact.accumulate(step, mine, step)
            metrics = self.finish(step, num_micro_batches, global_num_tokens)
        except Exception:
            self.exact.held = None  # train_step leaves nothing behind
            raise
        metrics["train_s"] = time.perf_counter() - t0
        return metrics

    def _fsdp_step(self, micro_batches: list[MicroBatch | None], global_num_tokens: int,
                   t0: float) -> dict[str, float]:
        cfg = self.config
        self.model.train()
        token_level = self.spec.aggregation == "token"
        # Token level: / the global token count up front (as always); the other aggregations
        # divide once the group's statistics give their normaliser (below).
        scale = self.num_ranks / global_num_tokens if token_level else float(self.num_ranks)
        # forward.STAT_KEYS (this rank's real micro-batches).
        stats = torch.zeros(NUM_STATS, dtype=torch.float64, device=self.device)
        for micro_batch in micro_batches:
            weight = 0.0 if micro_batch is None else 1.0
            padded = padding_micro_batch() if micro_batch is None else micro_batch
            loss_sum, mb_stats = micro_batch_loss(self.model, self.ref_model, padded,
                                                  self.spec, self.device)
            (loss_sum * (scale * weight)).backward()
            if micro_batch is not None:
                stats += mb_stats
        dist.all_reduce(stats, group=self.group)
        try:
            self._check_tokens(stats, global_num_tokens)
        except ValueError:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        if not token_level:
            denominator = loss_denominator(stats, self.spec)
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.div_(denominator)
        grad_norm = self._clip_grad_norm(cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self._metrics(stats, grad_norm, time.perf_counter() - t0)

    def _metrics(self, stats: torch.Tensor, grad_norm: float, train_s: float
                 ) -> dict[str, float]:
        pg_total, kl_total, tokens, clipped_total, _, _, entropy_total = stats.tolist()
        denominator = loss_denominator(stats, self.spec)
        loss = (pg_total + self.config.kl_coef * kl_total) / denominator
        metrics = {"loss": loss, "pg_loss": pg_total / denominator,
                   "kl": kl_total / denominator, "tokens": tokens,
                   "clip_fraction": clipped_total / tokens, "grad_norm": grad_norm,
                   "train_s": train_s}
        if self.spec.entropy_coef > 0:
            metrics["entropy"] = entropy_total / denominator
            metrics["loss"] = loss - self.spec.entropy_coef * metrics["entropy"]
        return metrics

    @staticmethod
    def _check_tokens(stats: torch.Tensor, global_num_tokens: int) -> None:
        tokens = int(stats[2])
        if tokens != global_num_tokens:
            raise ValueError(f"global_num_tokens = {global_num_tokens} but the group's "
                             f"micro-batches hold {tokens} response tokens")

    def _index(self, k: int, micro_batch: MicroBatch) -> int:
        """The global index of this rank's k-th micro-batch: its own (the balanced plan) or
        round-robin's k * R + rank."""
        if isinstance(micro_batch, IndexedMicroBatch):
            return micro_batch.global_index
        return k * self.num_ranks + self.rank

    def _check_rounds(self, micro_batches: list[MicroBatch | None]) -> tuple[int, bool]:
        """Unequal round counts (or an empty micro-batch on one rank) would deadlock FSDP's
        collectives and break the index of a round: agree first, and fail on every rank
        instead. Returns (number of micro-batches of the group, whether any rank's replica
        is stale)."""
        num_rounds = len(micro_batches)
        num_empty = sum(1 for mb in micro_batches if mb is not None and not mb)
        top = max((self._index(k, mb) + 1 for k, mb in enumerate(micro_batches)
                   if mb is not None), default=0)
        held = int(self.exact is not None and self.exact.held is not None)
        stale = int(self.exact is not None and not self.exact.fresh)
        counts = torch.tensor([num_rounds, -num_rounds, num_empty, top, held, stale],
                              device=self.device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=self.group)
        most, fewest, empty = int(counts[0]), -int(counts[1]), int(counts[2])
        if most != fewest:
            raise ValueError(f"ranks of the training group got between {fewest} and {most} "
                             "micro-batch rounds; pad with None (batching.plan_step)")
        if empty:
            raise ValueError("an empty micro-batch was passed; use None for a padding round")
        if int(counts[4]):
            raise ValueError("train_step while accumulated gradients are held; finish() or "
                             "take_holdings() first")
        if not int(counts[3]):
            raise ValueError("no rank of the training group got a micro-batch")
        return int(counts[3]), bool(counts[5])

    def _clip_grad_norm(self, max_norm: float) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=False)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        if max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=False)
        return float(norm)

    # ------------------------------------------------------------------ streaming (exact)

    def _exact(self) -> ExactReducer:
        if self.exact is None:
            raise ValueError("accumulate/finish/holdings need train.exact_reduction = true")
        return self.exact

    def accumulate(self, step: int, micro_batches: list[tuple[int, MicroBatch]]) -> None:
        """LOCAL: compute and hold the gradient of each (global index m, micro-batch) of
        `step`, for a later `finish`. Any rank may hold any indices, in any order, over any
        number of calls; holdings are of one step at a time."""
        self._exact().accumulate(step, micro_batches, self.optimizer_step_count())

    def finish(self, step: int, num_micro_batches: int,
               global_num_tokens: int) -> dict[str, float]:
        """COLLECTIVE: combine the group's holdings of `step` (every index 0..M-1 held by
        exactly one rank, or by none where the held ones already hold `global_num_tokens`:
        the balanced plan's empty slots), sum them in index order, / global_num_tokens, clip,
        one AdamW step; holdings are dropped. Metrics are identical on every rank, except `train_s`
        (this rank's accumulate compute + this call). On ValueError (an index held by no rank
        or by two, another step, a wrong token count) nothing changes, on every rank."""
        exact = self._exact()
        if num_micro_batches <= 0 or global_num_tokens <= 0:
            raise ValueError(f"num_micro_batches ({num_micro_batches}) and global_num_tokens "
                             f"({global_num_tokens}) must be > 0")
        t0 = time.perf_counter()
        grad, stats = exact.combine(step, num_micro_batches, self.optimizer_step_count(),
                                    global_num_tokens,
                                    lambda s: self._check_tokens(s, global_num_tokens))
        grad_norm = scale_and_clip_(grad, loss_denominator(stats, self.spec),
                                    self.config.max_grad_norm)
        exact.write_grads(grad)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        exact.sync()
        held = exact.take()
        compute_s = held.compute_s if held is not None else 0.0
        return self._metrics(stats, grad_norm, compute_s + time.perf_counter() - t0)

    def take_holdings(self) -> HeldGradients | None:
        """LOCAL: remove and return this rank's held gradients (None if none; always None
        without exact reduction). They stay valid for any trainer whose parameters are at the
        same optimizer step: e.g. the trainer a resize builds over a new group mid-step."""
        return self.exact.take() if self.exact is not None else None

    def put_holdings(self, held: HeldGradients | None) -> None:
        """LOCAL: add gradients from `take_holdings` (of any rank) to this rank's holdings
        (None: nothing); ValueError if they are of another step, other parameters or
        overlap."""
        if held is not None:
            self._exact().put(held, self.optimizer_step_count())

    def sync_replica(self) -> None:
        """COLLECTIVE: re-gather the exact path's replica from the shards (needed after the
        shards were written through `local_shards`; `train_step` does it by itself, the
        reshard and load paths call it). A no-op without exact reduction."""
        if self.exact is not None:
            self.exact.sync()
