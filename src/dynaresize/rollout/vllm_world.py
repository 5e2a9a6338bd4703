"""vLLM inside a device process that already has a torch.distributed world (the run's gloo
world): a private world for vLLM's start-up seen by the building thread only, and the model
directory vLLM loads from. No vLLM import here (see `rollout.vllm_engine`)."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

_VLLM_WORLD: Any = None
"""vLLM's private torch.distributed world (size 1), kept for the process's later engines."""
_VLLM_GROUPS: set[Any] = set()
"""The process groups created inside `private_world` (vLLM's default group and subgroups)."""
_SHARED_MAPS = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag")
"""torch's group maps that are module globals, shared by every `_World` (keyed by group)."""


class _ThreadWorlds:
    """Stands in for torch.distributed's module-level `_world` (every c10d function reads it
    through the module): a thread inside `private_world` sees vLLM's world, every other thread
    the device's. The device's reshard may run in another thread while this one builds an
    engine (resizes overlap the two), so the swap must not be process-wide.

    A `_World` keeps only its default group itself; its maps and its group counter are module
    globals shared by every instance. The maps may be shared (keyed by group object, vLLM's
    group names are distinct), the counter may not: it names new groups, and every rank of the
    device's world must count the same, whether or not it has built vLLM engines. So the
    counter of vLLM's world lives here, starting far from the device's."""

    def __init__(self, default: Any) -> None:
        object.__setattr__(self, "_default", default)
        object.__setattr__(self, "_local", threading.local())
        object.__setattr__(self, "_vllm_group_count", 1_000_000)

    def _private(self) -> Any:
        return getattr(self._local, "world", None)

    def __getattr__(self, name: str) -> Any:
        private = self._private()
        if private is None:
            return getattr(self._default, name)
        if name == "group_count":
            return self._vllm_group_count
        return getattr(private, name)

    def __setattr__(self, name: str, value: Any) -> None:
        private = self._private()
        if private is None:
            setattr(self._default, name, value)
        elif name == "group_count":
            object.__setattr__(self, "_vllm_group_count", value)
        else:
            setattr(private, name, value)


@contextlib.contextmanager
def private_world() -> Iterator[None]:
    """Run vLLM's start-up (which initialises torch.distributed for a world of one) in its own
    world, in this thread only. Also keeps `torch.set_num_threads`, which vLLM's CPU worker
    replaces by a no-op."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    global _VLLM_WORLD
    if not isinstance(c10d._world, _ThreadWorlds):
        c10d._world = _ThreadWorlds(c10d._world)
    if _VLLM_WORLD is None:
        _VLLM_WORLD = c10d._World()
    local, set_num_threads = c10d._world._local, torch.set_num_threads
    local.world = _VLLM_WORLD
    before = set(c10d._world.pg_names)
    try:
        yield
    finally:
        _VLLM_GROUPS.update(set(c10d._world.pg_names) - before)
        local.world = None
        torch.set_num_threads = set_num_threads


@contextlib.contextmanager
def vllm_groups_kept_apart() -> Iterator[None]:
    """Around the device's `destroy_process_group()` (a world rebuild): that call shuts down
    and forgets every group in torch's maps, which vLLM's world shares (module globals), so
    vLLM's next engine in this process failed ("... not initialized in the world group map").
    vLLM's groups leave the maps for the call and come back after it, registered by name
    again (the call unregisters every name)."""
    import torch.distributed.distributed_c10d as c10d

    world = c10d._world
    kept = {name: {pg: getattr(world, name).pop(pg) for pg in list(getattr(world, name))
                   if pg in _VLLM_GROUPS} for name in _SHARED_MAPS}
    tags = {tag: [pg for pg in pgs if pg in _VLLM_GROUPS]
            for tag, pgs in world.tags_to_pg.items()}
    for pgs in world.tags_to_pg.values():
        pgs[:] = [pg for pg in pgs if pg not in _VLLM_GROUPS]
    try:
        yield
    finally:
        for name, entries in kept.items():
            getattr(world, name).update(entries)
        for tag, pgs in tags.items():
            if pgs:
                world.tags_to_pg.setdefault(tag, []).extend(pgs)
        for pg, group_name in kept["pg_names"].items():
            c10d._register_process_group(group_name, pg)


def model_dir(template: Any) -> str:
    """A directory holding `template` (a transformers model) as a checkpoint, written once per
    template object, again if removed (vLLM loads models from disk; see `drop_model_dir`). A
    save that fails removes its directory."""
    path = getattr(template, "_dynaresize_vllm_dir", None)
    if path is None or not os.path.isfile(os.path.join(path, "config.json")):
        root = "/dev/shm" if os.path.isdir("/dev/shm") else None
        path = tempfile.mkdtemp(prefix="dynaresize-vllm-model-", dir=root)
        try:
            with private_world():  # save_pretrained writes nothing on a world rank but 0
                template.save_pretrained(path)
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise RuntimeError(f"saving the model for vLLM to {path} wrote no config.json")
        except BaseException:  # a partial save (a full /dev/shm): no folder is left behind
            shutil.rmtree(path, ignore_errors=True)
            raise
        template._dynaresize_vllm_dir = path
        atexit.register(shutil.rmtree, path, True)
    return path


def drop_model_dir(template: Any) -> None:
    """Remove `template`'s directory once an engine has loaded it: a device process is killed
    (SIGKILL) at the end of a pool's life, so nothing would remove it from /dev/shm later. The
    next engine of this process writes it again (ms for the tiny model)."""
    path = getattr(template, "_dynaresize_vllm_dir", None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
