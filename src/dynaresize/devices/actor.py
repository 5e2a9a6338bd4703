"""DeviceActor: the process behind one RayDevice (one GPU or one CPU slot), long-lived.

It joins the world process group once at start-up, keeps a communicator cache keyed by member
set, and hosts a rollout engine and/or a trainer shard depending on its role. Everything here
runs inside the actor process; the driver only sees `RayDevice`.
"""

from __future__ import annotations

import os
import time
from typing import Any

LOOPBACK = "127.0.0.1"


def loopback_env() -> dict[str, str]:
    """Environment that keeps gloo / NCCL / Ray traffic on loopback (DESIGN §6)."""
    return {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": LOOPBACK, "NCCL_SOCKET_IFNAME": "lo",
            "TP_SOCKET_IFNAME": "lo", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


class DeviceActor:
    def __init__(self, index: int, world_size: int, store_port: int, device_type: str,
                 threads: int) -> None:
        os.environ.update(loopback_env())
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        self.index = index
        self.world_size = world_size
        self.device_type = device_type
        backend = "nccl" if device_type == "cuda" else "gloo"
        self.torch_device = "cuda:0" if device_type == "cuda" else "cpu"
        if device_type == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method=f"tcp://{LOOPBACK}:{store_port}",
                                rank=index, world_size=world_size)
        self.groups: dict[tuple[int, ...], Any] = {}
        self.group_creations = 0
        self.engine: Any = None
        self.trainer: Any = None
        self.cfg: Any = None
        self.task: Any = None
        self._mesh_generation = 0

    def ready(self) -> int:
        return os.getpid()

    # ------------------------------------------------------------------ configuration
    def configure(self, cfg_dict: dict[str, Any], role: str) -> None:
        """Start a run: drop the previous run's engine and trainer, build what `role` needs."""
        from dynaresize.config import config_from_dict
        from dynaresize.tasks import make_task

        self.engine = None
        self.trainer = None
        self.cfg = config_from_dict(cfg_dict)
        self.task = make_task(self.cfg)
        if role == "rollout":
            self._build_engine()

    def _build_model(self) -> Any:
        from dynaresize.models import build_model

        tok = self.task.tokenizer
        model = build_model(self.cfg.model, tok.vocab_size, eos_token_id=tok.eos_id,
                            bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)
        return model.to(self.torch_device)

    def _build_engine(self) -> None:
        from dynaresize.rollout.engine import RolloutEngine

        self.engine = RolloutEngine(self._build_model(), eos_token_id=self.task.tokenizer.eos_id,
                                    device_index=self.index,
                                    max_running=self.cfg.rollout.max_running_requests,
                                    batch_invariant=self.cfg.rollout.batch_invariant,
                                    torch_device=self.torch_device)

    # ------------------------------------------------------------------ communicators
    def group(self, members: tuple[int, ...]) -> Any:
        """Communicator cache: every world rank calls this with the same members, same order."""
        import torch.distributed as dist

        members = tuple(sorted(members))
        if members not in self.groups:
            self.groups[members] = dist.new_group(ranks=list(members))
            self.group_creations += 1
        return self.groups[members]

    def join_train_group(self, members: tuple[int, ...], generation: int) -> int:
        group = self.group(members)
        if self.index in members:
            from dynaresize.train.trainer import FSDPTrainer

            self._mesh_generation += 1
            self.trainer = FSDPTrainer(self._build_model, self.cfg.train, group,
                                       generation=self._mesh_generation,
                                       device=self.torch_device,
                                       temperature=self.cfg.rollout.temperature,
                                       pad_token_id=self.task.tokenizer.pad_id)
        return self.group_creations

    # ------------------------------------------------------------------ rollout
    def load_weights(self, version: int, state_dict: dict[str, Any]) -> None:
        if self.engine is None:
            self._build_engine()
        self.engine.load_weights(state_dict, version)

    def submit(self, items: list[Any]) -> None:
        for item in items:
            self.engine.add(item)

    def run_rollout(self, max_s: float) -> list[Any]:
        return self.engine.run(max_s)

    def export_inflight(self) -> list[Any]:
        return self.engine.export_inflight() if self.engine is not None else []

    # ------------------------------------------------------------------ train
    def train_step(self, step: int, micro_batches: list[Any], global_num_tokens: int
                   ) -> dict[str, float]:
        t0 = time.perf_counter()
        stats = self.trainer.train_step(micro_batches, global_num_tokens)
        stats["actor_s"] = time.perf_counter() - t0
        return stats

    def publish_weights(self, version: int) -> tuple[bool, dict[str, Any] | None]:
        """Collective over the training group; returns (done, full state on group rank 0)."""
        return True, self.trainer.full_state_dict()

    def param_checksum(self) -> tuple[float, str]:
        return self.trainer.param_checksum()

    def stats(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "group_creations": self.group_creations,
                "num_groups": len(self.groups)}
