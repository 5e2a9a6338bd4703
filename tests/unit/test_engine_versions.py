"""EngineVersions: loads only what is stale, logs each load, and lets recovery fence a death."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from dynaresize.orchestrator.engine_versions import NO_ENGINE, EngineVersions


class _Device:
    def __init__(self, index: int, dies: bool = False) -> None:
        self.index, self.dies, self.loaded = index, dies, []

    async def load_weights(self, version: int, handle: Any) -> None:
        if self.dies:
            raise RuntimeError(f"device {self.index} died")
        self.loaded.append(version)


def _versions(events: list) -> EngineVersions:
    rundir = SimpleNamespace(event=lambda *args, **kwargs: events.append((args, kwargs)))
    return EngineVersions(range(3), SimpleNamespace(now=lambda: 1.0), rundir)  # type: ignore[arg-type]


def test_only_stale_engines_load_and_each_load_is_an_event() -> None:
    events: list = []
    versions = _versions(events)
    devices = [_Device(i) for i in range(3)]
    versions.set_loaded(1, 4)
    asyncio.run(versions.load(4, "w4", devices))  # type: ignore[arg-type]
    assert [d.loaded for d in devices] == [[4], [], [4]]
    assert [args[2] for args, _ in events] == [0, 2]
    assert all(kw == {"critical": True, "version": 4} for _, kw in events)
    asyncio.run(versions.load(4, "w4", devices))  # type: ignore[arg-type]
    assert len(events) == 2  # nothing stale, nothing loaded


def test_an_engine_gone_loads_even_the_version_it_served() -> None:
    versions = _versions([])
    device = _Device(0)
    versions.gone(0)
    assert versions.of(0) == NO_ENGINE
    asyncio.run(versions.load(0, "w0", [device]))  # type: ignore[list-item]
    assert device.loaded == [0] and versions.of(0) == 0


def test_a_death_the_handler_fences_keeps_the_old_version_and_others_propagate() -> None:
    versions = _versions([])
    dead, alive = _Device(0, dies=True), _Device(1)
    with pytest.raises(RuntimeError, match="device 0 died"):  # no handler: an error
        asyncio.run(versions.load(2, "w2", [dead]))  # type: ignore[list-item]
    versions.on_lost(lambda device, exc: False)  # the handler says: not a death
    with pytest.raises(RuntimeError, match="device 0 died"):
        asyncio.run(versions.load(2, "w2", [dead]))  # type: ignore[list-item]
    fenced: list[int] = []
    versions.on_lost(lambda device, exc: fenced.append(device.index) is None)
    asyncio.run(versions.load(2, "w2", [dead, alive]))  # type: ignore[list-item]
    assert fenced == [0] and versions.of(0) == 0 and versions.of(1) == 2
