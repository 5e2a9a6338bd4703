"""What the twin charges for a resize's fine-grained ops and for a recovery (design §4), part of
a `sim.costs.CostModel`: `ResizeCosts` (communicators, KV cache, engine warm-up, in-flight
export, resharding bandwidth), `RecoveryCosts` (checkpoints, a new world after a device
death) and `reshard_bytes`, the bytes each device sends when the training state's shards
move to a new group.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol


class ModelSize(Protocol):
    """What a recovery's costs read of the model (`sim.costs.ModelSpec`)."""

    @property
    def num_params(self) -> float: ...


@dataclass(frozen=True)
class ResizeCosts:
    """Seconds (or bytes/s) charged for each fine-grained resize op (design §4)."""

    join_group_first_s: float = 2.0
    """Creating a communicator the first time (NCCL init at scale takes seconds)."""
    join_group_cached_s: float = 0.01
    """Reusing a cached communicator."""
    reshard_bytes_per_s: float = 50e9
    """Training-state staging between ranks (one 400 Gb/s NIC per GPU)."""
    alloc_kv_s: float = 0.5
    release_kv_s: float = 0.05
    start_serving_s: float = 1.0
    """Engine warm-up (CUDA-graph capture with cached kernels)."""
    export_per_request_s: float = 1e-5
    """Serialising one in-flight request (token prefix + sampler state)."""
    staging_chunk_s: float = 1e-4
    """Per staging-buffer chunk of a reshard: one send/recv round plus a copy launch."""
    release_weights_s: float = 0.05
    """Freeing the rollout engine's weights, or a former trainer's state (deferrable)."""
    commit_s: float = 0.01
    """Swapping in the prepared trainer: a barrier over the new group."""
    offload_bytes_per_s: float = 25e9
    """Host <-> device copies of training state (PCIe 5 x16, about half of peak); only the
    `colocated` baseline offloads, as a hybrid engine does between its two roles."""


@dataclass(frozen=True)
class RecoveryCosts:
    """Seconds charged for checkpoints and for a new world after a device death."""

    checkpoint_bytes_per_param: int = 12
    """What a checkpoint holds per parameter: fp32 master weights + two AdamW moments."""
    disk_bytes_per_s: float = 2e9
    """Checkpoint write or read bandwidth per rank (to shared storage, each rank its shard)."""
    checkpoint_fixed_s: float = 1.0
    """Per save or load: DCP planning, metadata file, barriers."""
    rebuild_world_fixed_s: float = 5.0
    """Tearing down the old world and initialising a new one (all communicators gone)."""
    rebuild_world_per_rank_s: float = 2e-3
    """Rendezvous cost per surviving rank (the store sees every rank)."""

    def checkpoint_bytes(self, model: ModelSize) -> float:
        return model.num_params * self.checkpoint_bytes_per_param

    def save_s(self, model: ModelSize, num_ranks: int) -> float:
        """One rank writes its 1/num_ranks share of the training state."""
        return self.checkpoint_fixed_s + self.checkpoint_bytes(model) / max(1, num_ranks) \
            / self.disk_bytes_per_s

    def load_s(self, model: ModelSize, num_ranks: int) -> float:
        """One rank reads its share (resharded to the loading group's size)."""
        return self.save_s(model, num_ranks)

    def rebuild_world_s(self, num_ranks: int) -> float:
        return self.rebuild_world_fixed_s + self.rebuild_world_per_rank_s * num_ranks


@lru_cache(maxsize=256)
def reshard_bytes(old_members: tuple[int, ...], new_members: tuple[int, ...],
                  state_bytes: float) -> tuple[dict[int, float], float]:
    """Bytes each device sends when dim-0 shards of `state_bytes` move from an even split over
    `old_members` to one over `new_members` (rank r = r-th smallest device; what a device
    owns in both layouts stays local), and the most any one device sends or receives.
    O(len(old) + len(new)); cached, since every member of a resize asks for the same plan."""
    old, new = sorted(old_members), sorted(new_members)
    old_rank = {d: r for r, d in enumerate(old)}
    new_rank = {d: r for r, d in enumerate(new)}

    def span(rank: int, size: int) -> tuple[float, float]:
        return rank * state_bytes / size, (rank + 1) * state_bytes / size

    sent: dict[int, float] = {}
    busiest = 0.0
    for d in set(old) | set(new):
        a = span(old_rank[d], len(old)) if d in old_rank else (0.0, 0.0)
        b = span(new_rank[d], len(new)) if d in new_rank else (0.0, 0.0)
        kept = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
        sent[d] = (a[1] - a[0]) - kept
        busiest = max(busiest, sent[d], (b[1] - b[0]) - kept)
    return sent, busiest
