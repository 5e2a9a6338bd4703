"""The naive resize, measured: what a system without live resizing does for the same move.

For a move of device d to a new training group G' (rollout→train: d ∈ G'; train→rollout:
d ∉ G'), starting from a DCP checkpoint of the training state on disk:

1. stop d's actor (`ray.kill`) and start a fresh actor process for d (Ray worker start, import
   torch, as a device process does);
2. every member of G' creates a fresh process group for G' (`init_process_group`, world =
   |G'|): the fresh d, and the members that stay (their processes are already up, with
   everything imported: they only re-form the group);
3. every member of G' rebuilds the model (the model factory) + FSDP2 + AdamW, and loads model
   and optimizer state from the checkpoint (DCP reshards it to |G'| ranks);
4. train→rollout: the fresh d builds its rollout engine and loads the model weights from the
   same checkpoint (no process group needed).

The naive critical path is the wall time from the kill until every member of G' holds its
state and (train→rollout) d's engine is ready. Writing the checkpoint happens before and is
reported separately. A parameter checksum of the loaded state is returned so the caller can
check that the naive path really loaded the training state.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from dynaresize.devices.actor import loopback_env


class NaiveActor:
    """A fresh device process for the naive resize (its constructor imports torch)."""

    def __init__(self, threads: int) -> None:
        t0 = time.perf_counter()
        os.environ.update(loopback_env())
        import torch

        torch.set_num_threads(threads)
        self.import_s = time.perf_counter() - t0
        self.cfg: Any = None
        self.task: Any = None
        self.trainer: Any = None
        self.engine: Any = None

    def ready(self) -> dict[str, float]:
        return {"pid": float(os.getpid()), "import_s": self.import_s}

    def prepare(self, cfg_dict: dict[str, Any]) -> None:
        """Import and configure everything (a member that stays already has)."""
        import dynaresize.rollout.engine  # noqa: F401
        import dynaresize.train.checkpoint  # noqa: F401
        import dynaresize.train.trainer  # noqa: F401
        from dynaresize.config import config_from_dict
        from dynaresize.tasks import make_task

        self.cfg = config_from_dict(cfg_dict)
        self.task = make_task(self.cfg)

    def _model(self) -> Any:
        from dynaresize.models import build_model

        tok = self.task.tokenizer
        return build_model(self.cfg.model, tok.vocab_size, eos_token_id=tok.eos_id,
                           bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)

    def form_group(self, store: str, rank: int, world_size: int) -> float:
        """A fresh process group over the new training group (this process's default).
        `store`: a `file://` rendezvous, like the device pool's (no listening socket)."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world_size)
        return time.perf_counter() - t0

    def build_trainer(self, cfg_dict: dict[str, Any]) -> float:
        """Model factory + FSDP2 + AdamW over the whole (fresh) world."""
        import torch.distributed as dist

        from dynaresize.train.trainer import FSDPTrainer

        t0 = time.perf_counter()
        if self.cfg is None:
            self.prepare(cfg_dict)
        self.trainer = FSDPTrainer(self._model, self.cfg.train, dist.group.WORLD, generation=1,
                                   temperature=self.cfg.rollout.temperature,
                                   pad_token_id=self.task.tokenizer.pad_id)
        return time.perf_counter() - t0

    def load_train_state(self, path: str, optimizer_step: int) -> float:
        from dynaresize.train.checkpoint import load_train_state

        return load_train_state(self.trainer, path, optimizer_step)["load_s"]

    def build_engine(self, cfg_dict: dict[str, Any], path: str) -> dict[str, float]:
        """Rollout engine whose weights come from the checkpoint's model part."""
        from dynaresize.rollout.engine import RolloutEngine
        from dynaresize.train.checkpoint import load_model_weights

        t0 = time.perf_counter()
        if self.cfg is None:
            self.prepare(cfg_dict)
        model = self._model()
        t1 = time.perf_counter()
        load_s = load_model_weights(model, path)["load_s"]
        self.engine = RolloutEngine(model, eos_token_id=self.task.tokenizer.eos_id,
                                    device_index=0,
                                    max_running=self.cfg.rollout.max_running_requests,
                                    batch_invariant=self.cfg.rollout.batch_invariant)
        return {"build_s": t1 - t0, "load_s": load_s}

    def param_checksum(self) -> tuple[float, str]:
        if self.trainer is not None:
            return self.trainer.param_checksum()
        from dynaresize.train.trainer import checksum_named_tensors

        return checksum_named_tensors(self.engine.model.named_parameters())


@dataclass
class NaiveMeasurement:
    move: str
    critical_path_s: float
    """Kill of d's actor → every member ready (the naive resize's critical path)."""
    phases_s: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: spawn_import (d), form_group, build, load (the slowest member)."""
    param_sum: float = 0.0
    device_ready_s: float = 0.0
    """Kill → d works in its new role (rollout→train: = critical_path_s; train→rollout: its
    fresh engine holds the weights): what the stage waiting for d waits for."""


def _remote_cls(ray: Any) -> Any:
    return ray.remote(NaiveActor).options(num_cpus=0, max_restarts=0,
                                          runtime_env={"env_vars": loopback_env()})


def measure_naive(pool_actor: Any, device: int, new_train: tuple[int, ...],
                  cfg_dict: dict[str, Any], checkpoint: str, optimizer_step: int,
                  threads: int = 1) -> NaiveMeasurement:
    """Run the naive resize of `device` (module docstring); kills `pool_actor` (d's actor).
    The rendezvous file goes next to `checkpoint`."""
    import ray

    cls = _remote_cls(ray)
    staying = [i for i in new_train if i != device]
    stay = {i: cls.remote(threads) for i in staying}  # existing processes: not timed
    ray.get([a.prepare.remote(cfg_dict) for a in stay.values()])
    store, world = f"file://{checkpoint}-store-{device}", len(new_train)
    fresh: Any = None
    try:
        t0 = time.perf_counter()
        ray.kill(pool_actor, no_restart=True)
        fresh = cls.remote(threads)
        ready_ref = fresh.ready.remote()  # an actor runs its calls in submission order
        members = {**stay, **({device: fresh} if device in new_train else {})}
        groups = {i: a.form_group.remote(store, new_train.index(i), world)
                  for i, a in members.items()}
        builds = {i: a.build_trainer.remote(cfg_dict) for i, a in members.items()}
        loads = {i: a.load_train_state.remote(checkpoint, optimizer_step)
                 for i, a in members.items()}
        engine = None if device in new_train else fresh.build_engine.remote(cfg_dict, checkpoint)
        ready = ray.get(ready_ref)
        spawn_s = time.perf_counter() - t0
        engine_s = ray.get(engine) if engine is not None else {"build_s": 0.0, "load_s": 0.0}
        engine_ready_s = time.perf_counter() - t0
        group_s, build_s, load_s = (ray.get(list(r.values())) for r in (groups, builds, loads))
        total_s = time.perf_counter() - t0
        checks = ray.get([a.param_checksum.remote() for a in members.values()])
        phases = {"spawn_import": spawn_s, "import_torch": ready["import_s"],
                  "form_group": max(group_s), "build_model_fsdp": max(build_s),
                  "load_checkpoint": max(load_s), "engine_build": engine_s["build_s"],
                  "engine_load": engine_s["load_s"]}
        joins = device in new_train
        return NaiveMeasurement("rollout->train" if joins else "train->rollout",
                                total_s, phases, float(checks[0][0]),
                                device_ready_s=total_s if joins else engine_ready_s)
    finally:
        for a in [*stay.values(), *([fresh] if fresh is not None else [])]:
            ray.kill(a, no_restart=True)
