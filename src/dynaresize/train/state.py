"""Training state of `FSDPTrainer` (a mixin): full state in and out, checksums, and the local
dim-0 shards that resharding (`train.reshard_exec`) and checkpoints work on.

Parameters and AdamW moments are FSDP2 DTensors sharded on dim 0 over the training group in
both update paths (`TrainConfig.exact_reduction` or not); which methods are collective is said
in each docstring (the local ones: `full_shapes`, `local_shards`, `optimizer_step_count`,
`has_optimizer_state`, `init_optimizer_state`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from dynaresize.resize.reshard import optim_state_name, with_optimizer_state

if TYPE_CHECKING:
    from dynaresize.train.exact import ExactReducer

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


def once_per_object(state: Mapping[str, Any], fn: Callable[[Any], Any],
                    applies: Callable[[Any], bool] = lambda value: True) -> dict[str, Any]:
    """`state` with `fn` applied to every value `applies` to, once per object: a value under
    several keys (tied weights) is converted once and stays one object under all of them;
    the other values unchanged. Keys keep their order."""
    done: dict[int, Any] = {}
    out: dict[str, Any] = {}
    for key, value in state.items():
        if not applies(value):
            out[key] = value
            continue
        if id(value) not in done:
            done[id(value)] = fn(value)
        out[key] = done[id(value)]
    return out


class ShardedState:
    """State methods of `FSDPTrainer`; the attributes below are set by its constructor."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    group: dist.ProcessGroup
    mesh: DeviceMesh
    device: torch.device
    rank: int
    exact: ExactReducer | None

    def sync_replica(self) -> None:  # defined by FSDPTrainer
        raise NotImplementedError

    def _named_params(self) -> list[tuple[str, nn.Parameter]]:
        return list(self.model.named_parameters())  # tied parameters appear once

    @staticmethod
    def _full(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if isinstance(t, DTensor) else t

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Collective: unsharded CPU model state on the group's rank 0 (tied weights under
        every key, sharing storage), None on the other ranks."""
        out = once_per_object(self.model.state_dict(keep_vars=True),
                              lambda value: self._full(value).detach().cpu().clone())
        return out if self.rank == 0 else None

    def publish_state(self) -> dict[str, torch.Tensor] | None:
        """Collective: the values `full_state_dict` gives, for a caller that serialises them
        at once (a weight publish): with exact reduction on CPU and a replica that holds the
        current parameters on every rank, rank 0's replica tensors themselves (no gather, no
        copy: they change with the next step, so they must not be kept); otherwise (a GPU's
        replica too: a publish goes out on CPU) `full_state_dict`."""
        exact = self.exact
        usable = exact is not None and exact.fresh and self.device.type == "cpu"
        stale = torch.tensor([int(not usable)], device=self.device)
        dist.all_reduce(stale, op=dist.ReduceOp.MAX, group=self.group)  # one branch for all
        if exact is None or int(stale):
            return self.full_state_dict()
        if self.rank != 0:
            return None  # the replica's own tensors (its state dict, tied weights once)
        return once_per_object(exact.replica.state_dict(keep_vars=True), torch.Tensor.detach)

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
        Model and optimizer state are set separately (design §6). Missing keys raise
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
        self.sync_replica()

    # ------------------------------------------------------------------ resharding (local)

    def full_shapes(self) -> dict[str, tuple[tuple[int, ...], int]]:
        """Input of `resize.reshard.plan_reshard`: name -> (full shape, bytes per element) of
        every parameter and of its AdamW moments (`name::exp_avg`, `name::exp_avg_sq`)."""
        return with_optimizer_state({name: (tuple(p.shape), p.dtype.itemsize)
                                     for name, p in self._named_params()})

    def local_shards(self, writable: bool = True) -> dict[str, torch.Tensor]:
        """This rank's dim-0 shards under the names of `full_shapes` (moments only once they
        exist: after a step or `init_optimizer_state`). Detached views of the live storage:
        copying into them in place under `torch.no_grad()` changes the trainer's state.
        `writable` (the default) marks the exact path's replica stale: the next `train_step`
        re-gathers it, `accumulate` refuses until `sync_replica`; pass False to only read."""
        if writable and self.exact is not None:
            self.exact.fresh = False
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
