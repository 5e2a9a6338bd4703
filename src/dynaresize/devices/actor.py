"""DeviceActor: the process behind one RayDevice (one GPU or one CPU slot), long-lived.

It joins the world process group once at start-up, keeps a communicator cache keyed by member
set, and hosts a rollout engine and/or a trainer shard depending on its role. Everything here
runs inside the actor process; the driver only sees `RayDevice`.
"""

from __future__ import annotations

import os
import time
from typing import Any

from dynaresize.devices.builders import DeviceBuilder
from dynaresize.devices.cluster import NodeInfo, this_node
from dynaresize.devices.memory import release_dropped, release_free_memory
from dynaresize.devices.network import LOOPBACK, base_env, loopback_env, network_env
from dynaresize.devices.settings import DeviceSettings
from dynaresize.devices.world import init_world, open_store
from dynaresize.rollout.engine_base import Engine
from dynaresize.rollout.spec_stats import COUNTS, engine_counts

__all__ = ["LOOPBACK", "DeviceActor", "loopback_env"]


class DeviceActor:
    def __init__(self, index: int, world_size: int, store: str | None, device_type: str,
                 threads: int, pg_timeout_s: float = 60.0) -> None:
        self.node: NodeInfo = this_node()
        """This process's Ray node and the address it advertises (collectives use it)."""
        os.environ.update({**base_env(), **network_env(self.node.node_ip)})
        import torch

        torch.set_num_threads(threads)
        self.index = index
        self.world_size = world_size
        self.device_type = device_type
        # CUDA tensors over NCCL; CPU tensors (if any) still have gloo
        backend = "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"
        self.torch_device = "cuda:0" if device_type == "cuda" else "cpu"
        if device_type == "cuda":
            torch.cuda.set_device(0)
        self.backend = backend
        self.pg_timeout_s = pg_timeout_s
        self.rank_of = {i: i for i in range(world_size)}
        """Device index → world rank (identity until a world rebuild drops dead devices)."""
        if store is not None:  # else the pool forms the world (`rebuild_world`)
            init_world(backend, store, self.rank_of, index, pg_timeout_s)
        self.groups: dict[tuple[int, ...], Any] = {}
        self.group_creations = 0
        self._trim_due = False
        """A load_weights since the last `release_free_memory` (run_rollout does it)."""
        self.engine: Engine | None = None
        self._dropped_counts: dict[str, int] = {}
        """Rollout counters of the engines this device has dropped (`rollout_counts`)."""
        self.trainer: Any = None
        self._next_trainer: Any = None
        self._old_trainer: Any = None
        self.settings: DeviceSettings | None = None
        self._mesh_generation = 0
        self.builder = DeviceBuilder(index, self.torch_device)
        """Builds the model (from a kept template), engines and trainers."""

    def ready(self) -> int:
        return os.getpid()

    def freeze(self) -> None:
        """Stop this process (SIGSTOP; fault injection on another machine, `DevicePool.hang`)."""
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)

    def placement(self) -> NodeInfo:
        return self.node

    def open_store(self) -> str:
        """Reserve the next world's rendezvous on this device's node (`devices.world`)."""
        return open_store(self.node.node_ip)

    # ------------------------------------------------------------------ configuration
    def configure(self, settings: DeviceSettings, role: str) -> None:
        """Start a run: drop the previous run's engine and trainer, build what `role` needs."""
        self._drop_engine()
        self.trainer = self._next_trainer = self._old_trainer = None
        release_dropped()
        self.settings = settings
        if role == "rollout":
            self._build_engine()

    def _build_engine(self, blank: bool = False) -> None:
        self._drop_engine()
        self.engine = self.builder.engine(self._settings(), blank)

    def _settings(self) -> DeviceSettings:
        assert self.settings is not None, "configure() first"
        return self.settings

    # ------------------------------------------------------------------ communicators
    def group(self, members: tuple[int, ...]) -> Any:
        """Communicator cache: every world rank calls this with the same members, same order."""
        from dynaresize.devices.world import new_subgroup

        members = tuple(sorted(members))
        if members not in self.groups:  # the world's timeout (`faults.timeout_s`), not 30 min
            self.groups[members] = new_subgroup([self.rank_of[m] for m in members],
                                                self.pg_timeout_s)
            self.group_creations += 1
        return self.groups[members]

    def _new_trainer(self, members: tuple[int, ...], blank: bool = False) -> Any:
        """A trainer over `members` (`DeviceBuilder.trainer`; `blank`: a reshard fills it)."""
        self._mesh_generation += 1
        return self.builder.trainer(self._settings(), self.group(members),
                                    self._mesh_generation, blank)

    def join_train_group(self, members: tuple[int, ...], generation: int) -> int:
        self.group(members)
        if self.index in members:
            self.trainer = self._new_trainer(members)
        return self.group_creations

    def join_group(self, members: tuple[int, ...]) -> bool:
        before = self.group_creations
        self.group(members)
        return self.group_creations > before

    def reshard(self, old_members: tuple[int, ...], new_members: tuple[int, ...],
                generation: int, optimizer_step: int, staging_bytes: int) -> dict[str, float]:
        """Move training state from the old group's shards to a new trainer over new_members
        (kept beside the old one until `commit_train_group`)."""
        from dynaresize.resize.reshard import plan_reshard
        from dynaresize.train.reshard_exec import execute_reshard

        new = None
        if self.index in new_members:
            new = self._new_trainer(tuple(new_members), blank=True)  # the plan fills it all
            new.init_optimizer_state(optimizer_step)
        old = self.trainer if self.index in old_members else None
        shapes = (old or new).full_shapes()
        # the plan addresses world ranks (monotone in device index, so the layout is the same)
        plan = plan_reshard(shapes, tuple(self.rank_of[m] for m in old_members),
                            tuple(self.rank_of[m] for m in new_members), staging_bytes)
        stats = execute_reshard(plan, self.rank_of[self.index], old, new, optimizer_step,
                                staging_bytes)
        self._next_trainer = new
        return stats.as_dict()

    def commit_train_group(self, new_members: tuple[int, ...]) -> None:
        if self.index in new_members:
            held = self.trainer.take_holdings() if self.trainer is not None else None
            self.trainer, self._next_trainer = self._next_trainer, None
            if held is not None:  # gradients held for the step in progress stay valid
                self.trainer.put_holdings(held)
            release_dropped()  # the old trainer's state now lives in the new one
        else:
            self._old_trainer, self.trainer = self.trainer, None

    def abort_reshard(self) -> None:
        self._next_trainer = None
        release_dropped()

    def drop_trainer(self) -> None:
        self._old_trainer = None
        release_dropped()

    def _drop_engine(self) -> None:
        """Let go of the rollout engine (a vLLM engine is shut down: frees its memory)."""
        engine, self.engine = self.engine, None
        if engine is not None:
            for key, value in engine_counts(engine).items():
                self._dropped_counts[key] = self._dropped_counts.get(key, 0) + value
            engine.shutdown()

    def _engine(self) -> Engine:
        assert self.engine is not None, "no rollout engine on this device"
        return self.engine

    def release_kv(self) -> None:
        if self.engine is not None:
            assert self.engine.num_running == 0 and self.engine.num_waiting == 0
            self.engine.release_kv()  # vLLM: sleep on CUDA (vllm_engine)

    def release_rollout_weights(self) -> None:
        self._drop_engine()
        release_dropped()

    def alloc_kv(self) -> None:
        if self.engine is None:
            self._build_engine()
        else:
            self.engine.alloc_kv()  # vLLM: wake up on CUDA

    # ------------------------------------------------------------------ rollout
    def load_weights(self, version: int, state_dict: dict[str, Any] | None) -> None:
        """Install `version`; None means the initial weights (version 0, rebuilt from the
        model factory, identical on every device)."""
        from dynaresize.devices.weights_wire import from_wire

        state_dict = from_wire(state_dict)  # views of the object store's pages: no copy
        if state_dict is None:
            if version != 0:
                raise ValueError(f"no weights given for version {version}")
            self._build_engine()
            return
        if self.engine is None:
            self._build_engine(blank=True)  # load_weights overwrites every parameter (strict)
        self._engine().load_weights(state_dict, version)
        self._trim_due = True  # what receiving left free (in-band tensors: a copy)

    def run_rollout(self, max_s: float, until_empty: bool = False) -> list[Any]:
        if self._trim_due:  # after a load_weights: hand its freed copy's pages back
            self._trim_due = False
            release_free_memory()
        return self._engine().run(max_s, until_empty)

    def submit(self, items: list[Any]) -> None:
        """Queue `items` on the engine, all or none (`EngineBase.add_all`)."""
        self._engine().add_all(items)

    def export_inflight(self) -> list[Any]:
        return self.engine.export_inflight() if self.engine is not None else []

    # ------------------------------------------------------------------ train
    def train_step(self, step: int, micro_batches: list[Any], global_num_tokens: int
                   ) -> dict[str, float]:
        t0 = time.perf_counter()
        stats = self.trainer.train_step(micro_batches, global_num_tokens)
        release_free_memory()
        stats["actor_s"] = time.perf_counter() - t0
        return stats

    def train_accumulate(self, step: int, micro_batches: list[Any]) -> None:
        """Local: hold the gradients of these (index, micro-batch) pairs (streaming)."""
        self.trainer.accumulate(step, micro_batches)
        release_free_memory()  # the backward's activations and replica grads

    def train_finish(self, step: int, num_micro_batches: int, global_num_tokens: int
                     ) -> dict[str, float]:
        t0 = time.perf_counter()
        stats = self.trainer.finish(step, num_micro_batches, global_num_tokens)
        release_free_memory()
        stats["actor_s"] = time.perf_counter() - t0
        return stats

    def publish_weights(self, version: int) -> tuple[bool, dict[str, Any] | None]:
        """Collective over the training group; returns (done, full state on group rank 0)."""
        from dynaresize.devices.weights_wire import to_wire

        return True, to_wire(self.trainer.publish_state())  # out-of-band, no copy before it

    def param_checksum(self) -> tuple[float, str]:
        return self.trainer.param_checksum()

    def save_checkpoint(self, path: str) -> dict[str, float]:
        """Collective over the training group: write model + optimizer state with
        torch.distributed.checkpoint to the directory `path` (`train.checkpoint`)."""
        from dynaresize.train.checkpoint import save_train_state

        return save_train_state(self.trainer, path)

    def load_checkpoint(self, path: str, optimizer_step: int) -> dict[str, float]:
        """Collective over the training group: load a checkpoint written by a group of any
        size into this group's sharding (`train.checkpoint`)."""
        from dynaresize.train.checkpoint import load_train_state

        return load_train_state(self.trainer, path, optimizer_step)

    def rebuild_world(self, store: str, ranks: dict[int, int],
                      train_members: tuple[int, ...], optimizer_step: int,
                      keep_train_state: bool) -> None:
        """Collective over the surviving devices: a fresh world group, ranks renumbered, the
        training group rebuilt with the kept shards (the steps of `devices.world`)."""
        from dynaresize.devices.world import keep_shards, leave_world, restore_shards

        kept = keep_shards(self.trainer) \
            if keep_train_state and self.trainer is not None else None
        self.trainer = self._next_trainer = self._old_trainer = None
        release_dropped()
        self.groups.clear()
        leave_world()
        self.rank_of = {int(d): int(r) for d, r in ranks.items()}
        self.world_size = len(ranks)
        init_world(self.backend, store, self.rank_of, self.index, self.pg_timeout_s)
        members = tuple(sorted(train_members))
        if not members:
            return
        self.group(members)
        if self.index not in members:
            return
        self.trainer = self._new_trainer(members)
        restore_shards(self.trainer, kept, optimizer_step)

    def stats(self) -> dict[str, Any]:
        current = engine_counts(self.engine) if self.engine is not None else {}
        return {"pid": os.getpid(), "group_creations": self.group_creations,
                "num_groups": len(self.groups),
                "rollout_counts": {k: self._dropped_counts.get(k, 0) + current.get(k, 0)
                                   for k in COUNTS}}
