"""FSDP2 trainer over one training group: the only train module that touches process groups.

Consumes: a process group (the training group; may be a subgroup of the world, whose other
ranks are rollout devices and make no call here), a unique `generation` (names the DeviceMesh,
DESIGN §6), a factory returning the version-0 model (identical on every rank), a `TrainConfig`.
Produces: one optimizer step per `train_step`, full CPU state on the group's rank 0
(`full_state_dict`, `full_optim_state_dict`), a checksum identical on every rank, and for
resharding (`train.reshard_exec`) the local dim-0 shards (`local_shards`), the full shapes to
plan with (`full_shapes`) and fresh AdamW state at a given step (`init_optimizer_state`); these
three are local calls, not collectives.

The constructor and every public method are COLLECTIVE over the group: all its ranks (and
no other process) call them, in the same order; `train_step` with the same number of
micro-batch rounds on every rank (`batching.plan_step` pads with None for that).

Loss: micro-batch loss = loss_sum / global_num_tokens, multiplied by the group size R because
FSDP averages gradients over R ranks, so the summed update is exactly the gradient of the
global batch's token-mean loss whatever R (DESIGN §2.4).
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from dynaresize.config import TrainConfig
from dynaresize.resize.reshard import optim_state_name, with_optimizer_state
from dynaresize.train.batching import MicroBatch, PackedBatch, pack
from dynaresize.train.grpo import (
    clipped_token_count,
    kl_penalty_sum,
    ppo_clip_loss_sum,
    token_logprobs,
)
from dynaresize.types import TrainSample

OPTIM_KEYS = ("exp_avg", "exp_avg_sq")


def checksum_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[float, str]:
    """(sum as float64, SHA-256 of the raw bytes) over tensors in name order; a name seen twice
    counts once. `model.named_parameters()` of a plain model gives the trainer's checksum."""
    tensors = dict(named)
    total, digest = 0.0, hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        total += float(t.double().sum())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return total, digest.hexdigest()


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


def _padding_micro_batch() -> MicroBatch:
    """One 1-token sample: run with loss weight 0 so a rank's collectives line up."""
    return [TrainSample(step=-1, prompt=-1, sample=-1, prompt_tokens=[0], response_tokens=[0],
                        behavior_logprobs=[0.0], advantage=0.0, reward=0.0)]


class FSDPTrainer:
    """GRPO/PPO-clip policy trainer, FSDP2-sharded over `group` (see module docstring)."""

    def __init__(self, model_factory: Callable[[], nn.Module], config: TrainConfig,
                 group: dist.ProcessGroup, generation: int, *,
                 device: torch.device | str = "cpu", temperature: float = 1.0,
                 pad_token_id: int = 0) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.config = config
        self.group = group
        self.rank = dist.get_rank(group)
        self.num_ranks = dist.get_world_size(group)
        if self.rank < 0:
            raise ValueError("this process is not a member of the training group")
        self.device = torch.device(device)
        self.temperature = temperature
        self.pad_token_id = pad_token_id
        self.mesh = DeviceMesh.from_group(group, self.device.type,
                                          mesh_dim_names=(f"dp{generation}",))
        model = model_factory().to(self.device)
        reference = copy.deepcopy(model) if config.kl_coef > 0 else None
        self.model = _shard(model, self.mesh)
        self.ref_model: nn.Module | None = None
        if reference is not None:
            reference.requires_grad_(False)
            self.ref_model = _shard(reference.eval(), self.mesh)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr,
                                           weight_decay=config.weight_decay, foreach=False)

    # ------------------------------------------------------------------ training

    def _logprobs(self, model: nn.Module, batch: PackedBatch) -> torch.Tensor:
        # No attention mask: right padding never precedes a real token under causal attention.
        logits = model(input_ids=batch.input_ids.to(self.device), use_cache=False).logits
        if self.temperature != 1.0:
            logits = logits.float() / self.temperature
        return token_logprobs(logits, batch.targets.to(self.device))

    def train_step(self, micro_batches: list[MicroBatch | None],
                   global_num_tokens: int) -> dict[str, float]:
        """Forward/backward this rank's micro-batches (None: padding round, zero weight), clip,
        one AdamW step. Metrics are global (identical on every rank)."""
        if global_num_tokens <= 0:
            raise ValueError(f"global_num_tokens must be > 0, got {global_num_tokens}")
        t0 = time.perf_counter()
        cfg = self.config
        self._check_rounds(micro_batches)
        self.model.train()
        scale = self.num_ranks / global_num_tokens
        # pg_loss_sum, kl_sum, tokens, clipped tokens (this rank's real micro-batches).
        stats = torch.zeros(4, dtype=torch.float64, device=self.device)
        for micro_batch in micro_batches:
            weight = 0.0 if micro_batch is None else 1.0
            padded = _padding_micro_batch() if micro_batch is None else micro_batch
            batch = pack(padded, self.pad_token_id)
            mask = batch.loss_mask.to(self.device)
            old = batch.old_logprobs.to(self.device)
            logprobs = self._logprobs(self.model, batch)
            pg_sum = ppo_clip_loss_sum(logprobs, old, batch.advantages.to(self.device), mask,
                                       cfg.clip_eps)
            loss_sum = pg_sum
            kl_sum = torch.zeros((), device=self.device)
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_logprobs = self._logprobs(self.ref_model, batch)
                kl_sum = kl_penalty_sum(logprobs, ref_logprobs, mask)
                loss_sum = loss_sum + cfg.kl_coef * kl_sum
            (loss_sum * (scale * weight)).backward()
            if micro_batch is not None:
                clipped = clipped_token_count(logprobs, old, mask, cfg.clip_eps)
                stats += torch.stack([pg_sum.detach(), kl_sum.detach(), mask.sum(),
                                      clipped]).to(torch.float64)
        dist.all_reduce(stats, group=self.group)
        pg_total, kl_total, tokens, clipped_total = stats.tolist()
        if int(tokens) != global_num_tokens:
            self.optimizer.zero_grad(set_to_none=True)
            raise ValueError(f"global_num_tokens = {global_num_tokens} but the group's "
                             f"micro-batches hold {int(tokens)} response tokens")
        grad_norm = self._clip_grad_norm(cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = (pg_total + cfg.kl_coef * kl_total) / tokens
        return {"loss": loss, "pg_loss": pg_total / tokens, "kl": kl_total / tokens,
                "tokens": tokens, "clip_fraction": clipped_total / tokens,
                "grad_norm": grad_norm, "train_s": time.perf_counter() - t0}

    def _check_rounds(self, micro_batches: list[MicroBatch | None]) -> None:
        """Unequal round counts (or an empty micro-batch on one rank) would deadlock FSDP's
        collectives: agree first, and fail on every rank instead."""
        num_rounds = len(micro_batches)
        num_empty = sum(1 for mb in micro_batches if mb is not None and not mb)
        counts = torch.tensor([num_rounds, -num_rounds, num_empty], device=self.device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=self.group)
        most, fewest, empty = int(counts[0]), -int(counts[1]), int(counts[2])
        if most != fewest:
            raise ValueError(f"ranks of the training group got between {fewest} and {most} "
                             "micro-batch rounds; pad with None (batching.plan_step)")
        if empty:
            raise ValueError("an empty micro-batch was passed; use None for a padding round")

    def _clip_grad_norm(self, max_norm: float) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=False)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        if max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=False)
        return float(norm)

    # ------------------------------------------------------------------ state

    def _named_params(self) -> list[tuple[str, nn.Parameter]]:
        return list(self.model.named_parameters())  # tied parameters appear once

    @staticmethod
    def _full(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if isinstance(t, DTensor) else t

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Collective: unsharded CPU model state on the group's rank 0 (tied weights under
        every key, sharing storage), None on the other ranks."""
        out: dict[str, torch.Tensor] = {}
        gathered: dict[int, torch.Tensor] = {}
        for name, value in self.model.state_dict(keep_vars=True).items():
            if id(value) not in gathered:
                gathered[id(value)] = self._full(value).detach().cpu().clone()
            out[name] = gathered[id(value)]
        return out if self.rank == 0 else None

    def full_optim_state_dict(self) -> dict[str, dict[str, torch.Tensor]] | None:
        """Collective: AdamW state by parameter name, {"step", "exp_avg", "exp_avg_sq"},
        unsharded on CPU, on the group's rank 0; None elsewhere."""
        out: dict[str, dict[str, torch.Tensor]] = {}
        for name, param in self._named_params():
            state = self.optimizer.state.get(param, {})
            if not state:
                continue
            entry = {"step": state["step"].detach().cpu().clone()}
            for key in OPTIM_KEYS:
                entry[key] = self._full(state[key]).detach().cpu().clone()
            out[name] = entry
        return out if self.rank == 0 else None

    def param_checksum(self) -> tuple[float, str]:
        """Collective: (sum of all full parameters as float64, SHA-256 of their bytes in name
        order); the same on every rank and equal to `checksum_named_tensors` of a plain
        model holding these weights."""
        return checksum_named_tensors((name, self._full(p)) for name, p in self._named_params())

    def _shard_from_rank0(self, like: torch.Tensor, full: torch.Tensor | None) -> torch.Tensor:
        """Scatter `full` (meaningful on group rank 0) into `like`'s dim-0 sharding."""
        if not isinstance(like, DTensor):
            buf = (full if full is not None else torch.empty_like(like)).to(self.device)
            dist.broadcast(buf, group=self.group, group_src=0)
            return buf
        src = full if full is not None else torch.empty(like.shape, dtype=like.dtype)
        dt = distribute_tensor(src.to(self.device, like.dtype), self.mesh, [Shard(0)])
        assert dt.to_local().shape == like.to_local().shape, "sharding mismatch"
        return dt

    def load_full_state(self, model_sd: dict[str, torch.Tensor] | None,
                        optim_sd: dict[str, dict[str, torch.Tensor]] | None = None) -> None:
        """Collective: install full state held by the group's rank 0 (other ranks pass None).
        Model and optimizer state are set separately (DESIGN §6). Missing keys raise
        ValueError on every rank."""
        names = [name for name, _ in self._named_params()]
        meta: list[Any] = [None]
        if self.rank == 0:
            missing = [n for n in names if model_sd is None or n not in model_sd]
            if optim_sd is not None:
                missing += [f"optim:{n}" for n in names if n not in optim_sd]
            steps = None if optim_sd is None else {n: float(optim_sd[n]["step"])
                                                   for n in names if n in optim_sd}
            meta = [{"missing": missing, "steps": steps}]
        dist.broadcast_object_list(meta, group=self.group, group_src=0)
        if meta[0]["missing"]:
            raise ValueError(f"full state lacks {meta[0]['missing'][:5]}")
        steps = meta[0]["steps"]
        for name, param in self._named_params():
            full = model_sd[name] if self.rank == 0 and model_sd is not None else None
            value = self._shard_from_rank0(param, full)
            with torch.no_grad():
                local = param.to_local() if isinstance(param, DTensor) else param
                local.copy_(value.to_local() if isinstance(value, DTensor) else value)
            if steps is None:
                continue
            state = self.optimizer.state[param]
            state["step"] = torch.tensor(steps[name], dtype=torch.float32)
            for key in OPTIM_KEYS:
                full = optim_sd[name][key] if self.rank == 0 and optim_sd is not None else None
                state[key] = self._shard_from_rank0(param, full)

    # ------------------------------------------------------------------ resharding (local)

    def full_shapes(self) -> dict[str, tuple[tuple[int, ...], int]]:
        """Input of `resize.reshard.plan_reshard`: name -> (full shape, bytes per element) of
        every parameter and of its AdamW moments (`name::exp_avg`, `name::exp_avg_sq`)."""
        return with_optimizer_state({name: (tuple(p.shape), p.dtype.itemsize)
                                     for name, p in self._named_params()})

    def local_shards(self) -> dict[str, torch.Tensor]:
        """This rank's dim-0 shards under the names of `full_shapes` (moments only once they
        exist: after a step or `init_optimizer_state`). Detached views of the live storage:
        copying into them in place under `torch.no_grad()` changes the trainer's state."""
        out: dict[str, torch.Tensor] = {}
        for name, param in self._named_params():
            out[name] = _local(param).detach()
            state = self.optimizer.state.get(param, {})
            for key in OPTIM_KEYS:
                if key in state:
                    out[optim_state_name(name, key)] = _local(state[key])
        return out

    def optimizer_step_count(self) -> int:
        """AdamW steps behind the current state (0 before the first step)."""
        steps = {int(s["step"]) for s in self.optimizer.state.values() if "step" in s}
        assert len(steps) <= 1, f"parameters disagree on the optimizer step: {steps}"
        return steps.pop() if steps else 0

    def has_optimizer_state(self) -> bool:
        """True once every parameter has its AdamW moments."""
        return all(all(k in self.optimizer.state.get(p, {}) for k in OPTIM_KEYS)
                   for _, p in self._named_params())

    def init_optimizer_state(self, step: int) -> None:
        """Install AdamW state as after `step` steps, with zero moments (a reshard fills them),
        so that the next `train_step` continues from step `step` + 1. Replaces any state."""
        if step < 0:
            raise ValueError(f"optimizer step must be >= 0, got {step}")
        for _, param in self._named_params():
            self.optimizer.state[param] = {
                "step": torch.tensor(float(step), dtype=torch.float32),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a view of FSDP's storage), or `t` itself."""
    return t.to_local() if isinstance(t, DTensor) else t
