"""The world process group of the device actors: its rendezvous, its formation, and its
re-formation after a device died. Everything here runs inside a device actor.

Rendezvous (`open_store`, `connect_store`): a `TCPStore` served by one device of the world (the
driver picks the first live device, rank 0) on the address its Ray node advertises:
127.0.0.1 in the local default, the node's cluster address in a joined cluster, so it works
across nodes for gloo and NCCL alike. The listening socket is bound here, to that one address,
and handed to the store (`master_listen_fd`): a TCPStore opened by port alone binds every
interface (`::`). Each world (start-up, every rebuild) gets a fresh store, so keys never
collide; a store dies with its host, which is why a rebuild opens a new one on a survivor.
Subgroups (`DeviceActor.group`, the communicator cache: `new_subgroup`) rendezvous through the
world's store and time out as the world does (`faults.timeout_s`).

Re-forming the world after a device died (`DeviceActor.rebuild_world`, with the helpers here).
With gloo, a collective that includes a dead rank fails ("connection closed by peer") or, if
the peer hangs, times out after `faults.timeout_s` (`init_process_group(timeout=...)`); the
world's store may have died with its host; and `new_group` needs every world rank. So the
survivors leave the old world and form a new one:

1. each survivor keeps a CPU copy of its training shards if its group lost nobody
   (`keep_train_state`): the training members keep their order, so rank r of the new training
   group owns exactly the rows it owned before (FSDP dim-0 shards depend only on rank and size);
2. `destroy_process_group()` drops the world and every cached subgroup (the old trainer's mesh
   with them);
3. `init_process_group` on a fresh store (`DevicePool.new_store`), ranks renumbered in device
   order (`ranks`: device index → new rank);
4. every survivor creates the new training group (gloo: all world ranks call `new_group`), the
   training members build a new trainer over it and copy their kept shards back in (or, when a
   training rank died, start from the version-0 model and let the orchestrator load the
   recovery point: `recovery.py`).

Rollout engines are untouched: rollout needs no process group. The start-up world is step 3
alone (`init_world`).
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynaresize.train.trainer import FSDPTrainer

STORE_SCHEME = "tcp://"

_reserved: dict[str, socket.socket] = {}
"""Store address → the listening socket this process bound for it (`open_store`), until the
store that serves it is created (`connect_store`)."""


def open_store(host: str) -> str:
    """Bind a listening socket on `host` (this node's advertised address), port chosen by the
    kernel, for the next world's store; returns its address `tcp://HOST:PORT`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(512)
    port = sock.getsockname()[1]
    address = f"{STORE_SCHEME}[{host}]:{port}" if family == socket.AF_INET6 \
        else f"{STORE_SCHEME}{host}:{port}"
    _reserved[address] = sock
    return address


def split_address(address: str) -> tuple[str, int]:
    """`tcp://HOST:PORT` (HOST may be `[v6]`) → (HOST, PORT)."""
    if not address.startswith(STORE_SCHEME):
        raise ValueError(f"store {address!r}: expected {STORE_SCHEME}HOST:PORT")
    host, _, port = address[len(STORE_SCHEME):].rpartition(":")
    return host.strip("[]"), int(port)


def connect_store(address: str, world_size: int, timeout_s: float) -> Any:
    """The store at `address`: its server if this process reserved the socket, else a client."""
    import torch.distributed as dist

    host, port = split_address(address)
    sock = _reserved.pop(address, None)
    timeout = timedelta(seconds=timeout_s)
    if sock is None:
        return dist.TCPStore(host, port, world_size, False, timeout)
    store = dist.TCPStore(host, port, world_size, True, timeout, wait_for_workers=False,
                          master_listen_fd=sock.fileno())
    sock.detach()  # the store's server owns the descriptor now
    return store


def init_world(backend: str, store: str, ranks: dict[int, int], index: int,
               pg_timeout_s: float) -> None:
    """Join the world group whose rendezvous is `store`, as rank `ranks[index]`."""
    import torch.distributed as dist

    dist.init_process_group(backend, store=connect_store(store, len(ranks), pg_timeout_s),
                            rank=ranks[index], world_size=len(ranks),
                            timeout=timedelta(seconds=pg_timeout_s))


def new_subgroup(ranks: list[int], pg_timeout_s: float) -> Any:
    """A subgroup of the world (every world rank calls it) with the world's timeout: without
    one, `new_group` takes torch's default (30 min for gloo), so a collective with a dead peer
    in a subgroup (the training group) would wait that long instead of `faults.timeout_s`."""
    import torch.distributed as dist

    return dist.new_group(ranks=ranks, timeout=timedelta(seconds=pg_timeout_s))


def keep_shards(trainer: FSDPTrainer) -> dict[str, Any]:
    """A CPU copy of `trainer`'s training shards (step 1 of the module docstring)."""
    return {k: v.detach().clone() for k, v in trainer.local_shards().items()}


def leave_world() -> None:
    """Drop the world group and every cached subgroup (step 2); the groups of vLLM's private
    world in this process stay (`rollout.vllm_world.vllm_groups_kept_apart`)."""
    import torch.distributed as dist

    from dynaresize.rollout.vllm_world import vllm_groups_kept_apart

    if dist.is_initialized():
        with vllm_groups_kept_apart():
            dist.destroy_process_group()


def restore_shards(trainer: FSDPTrainer, kept: dict[str, Any] | None,
                   optimizer_step: int) -> None:
    """Copy the kept shards into a rebuilt trainer (step 4; None: it starts from version 0),
    then sync its replica (collective over the training group)."""
    import torch

    if kept is not None:
        trainer.init_optimizer_state(optimizer_step)
        shards = trainer.local_shards()
        if set(kept) - set(shards):
            raise RuntimeError(f"kept shards {sorted(set(kept) - set(shards))[:3]} have no "
                               "place in the rebuilt trainer")
        with torch.no_grad():
            for name, value in kept.items():
                shards[name].copy_(value)
    trainer.sync_replica()  # collective over members: exact reduction's replica
