"""Re-forming the world process group after a device died (runs inside each surviving actor).

Why: with gloo, a collective that includes a dead rank fails ("connection closed by peer") or,
if the peer hangs, times out after `faults.timeout_s` (`init_process_group(timeout=...)`); the
world's TCPStore lives in world rank 0, which may be the dead one; and `new_group` needs every
world rank. So the survivors leave the old world and form a new one:

1. each survivor keeps a CPU copy of its training shards if its group lost nobody
   (`keep_train_state`): the training members keep their order, so rank r of the new training
   group owns exactly the rows it owned before (FSDP dim-0 shards depend only on rank and size);
2. `destroy_process_group()` drops the world and every cached subgroup (the old trainer's mesh
   with them);
3. `init_process_group` on a fresh store (a new file: `DevicePool.new_store`), ranks
   renumbered in device order (`ranks`: device index → new rank);
4. every survivor creates the new training group (gloo: all world ranks call `new_group`), the
   training members build a new trainer over it and copy their kept shards back in (or, when a
   training rank died, start from the version-0 model and let the orchestrator load the
   recovery point: `recovery.py`).

Rollout engines are untouched: rollout needs no process group.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dynaresize.devices.actor import init_method


def rebuild_world(actor: Any, store: int | str, ranks: dict[int, int],
                  train_members: tuple[int, ...], optimizer_step: int,
                  keep_train_state: bool) -> None:
    """See the module docstring. `actor` is the DeviceActor of this process."""
    import torch
    import torch.distributed as dist

    kept: dict[str, torch.Tensor] | None = None
    if keep_train_state and actor.trainer is not None:
        kept = {k: v.detach().clone() for k, v in actor.trainer.local_shards().items()}
    actor.trainer = actor._next_trainer = actor._old_trainer = None
    actor.groups.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
    actor.rank_of = {int(d): int(r) for d, r in ranks.items()}
    actor.world_size = len(ranks)
    dist.init_process_group(actor.backend, init_method=init_method(store),
                            rank=actor.rank_of[actor.index], world_size=len(ranks),
                            timeout=timedelta(seconds=actor.pg_timeout_s))
    members = tuple(sorted(train_members))
    if not members:
        return
    actor.group(members)
    if actor.index not in members:
        return
    actor.trainer = actor._new_trainer(members)
    if kept is not None:
        actor.trainer.init_optimizer_state(optimizer_step)
        shards = actor.trainer.local_shards()
        if set(kept) - set(shards):
            raise RuntimeError(f"kept shards {sorted(set(kept) - set(shards))[:3]} have no "
                               "place in the rebuilt trainer")
        with torch.no_grad():
            for name, value in kept.items():
                shards[name].copy_(value)
    actor.trainer.sync_replica()  # collective over members: exact reduction's replica
