"""The device seam: `Device` is exactly the union of the four role protocols, both backends
implement every op with the protocol's signature, and a twin run with a resize, streaming, a
checkpoint and a device death calls nothing on a device outside the protocol."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from dynaresize.protocols import ROLE_PROTOCOLS, Device, DeviceSlot, RecoveryOps
from dynaresize.sim.device import SimDevice


def ops(proto: type) -> dict[str, inspect.Signature]:
    """Name -> signature of every method a protocol declares (its protocol bases included)."""
    out: dict[str, inspect.Signature] = {}
    for cls in reversed(proto.__mro__):
        if not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue
        for name, value in vars(cls).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                out[name] = inspect.signature(value)
    return out


def shape(sig: inspect.Signature) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def test_device_is_the_union_of_the_role_protocols() -> None:
    union: dict[str, inspect.Signature] = {}
    for proto in ROLE_PROTOCOLS:
        for name, sig in ops(proto).items():
            assert union.setdefault(name, sig) == sig, name  # no op in two roles differently
    assert ops(Device) == union
    assert set(ops(DeviceSlot)) == {"start", "stop"}
    assert {"save_checkpoint", "load_checkpoint", "rebuild_world"} <= set(ops(RecoveryOps))


def backends() -> list[type]:
    classes: list[type] = [SimDevice]
    try:
        from dynaresize.devices.ray_device import RayDevice
    except ImportError:  # Ray or torch missing: the twin alone
        return classes
    return [*classes, RayDevice]


@pytest.mark.parametrize("cls", backends(), ids=lambda c: c.__name__)
def test_backends_implement_every_op(cls: type) -> None:
    for name, sig in ops(Device).items():
        method = getattr(cls, name, None)
        assert method is not None, f"{cls.__name__}.{name} is missing"
        assert inspect.iscoroutinefunction(method), f"{cls.__name__}.{name} is not async"
        assert shape(inspect.signature(method)) == shape(sig), f"{cls.__name__}.{name}"


def test_process_tables_implement_the_protocol() -> None:
    from dynaresize.protocols import ProcessTable
    from dynaresize.sim.faults import SimProcesses

    tables: list[type] = [SimProcesses]
    try:
        from dynaresize.devices.pool import DevicePool
        tables.append(DevicePool)
    except ImportError:
        pass
    for cls in tables:
        for name, sig in ops(ProcessTable).items():
            method = getattr(cls, name)
            assert not inspect.iscoroutinefunction(method), f"{cls.__name__}.{name}"
            assert shape(inspect.signature(method)) == shape(sig), f"{cls.__name__}.{name}"


class Recording:
    """A device that records which of its attributes the run uses."""

    def __init__(self, device: Any, used: set[str]) -> None:
        self._device, self._used = device, used

    def __getattr__(self, name: str) -> Any:
        self._used.add(name)
        return getattr(self._device, name)


def test_a_twin_run_calls_only_protocol_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynaresize.config import KillEntry, ResizeEntry, validate
    from dynaresize.sim import harness
    from dynaresize.sim.costs import get_cost_model
    from dynaresize.sim.workloads import get_workload

    used: set[str] = set()
    make = harness.make_devices
    monkeypatch.setattr(harness, "make_devices", lambda *a, **k: [
        Recording(d, used) for d in make(*a, **k)])
    wl = get_workload("balanced", prompts_per_step=8, samples_per_prompt=4,
                      max_response_tokens=512)
    costs = get_cost_model("h100-7b")
    for policy, kill in (("static", "train"), ("hysteresis", "rollout:0.5")):
        cfg = harness.sim_config(wl, 4, 4, 3, 0, 0, costs)
        cfg.controller.policy = policy
        cfg.run.checkpoint_every = 1
        cfg.resize.schedule = [
            ResizeEntry(step=0, at="rollout:0.5", move="train->rollout", num_devices=1),
            ResizeEntry(step=2, at="rollout:0.5", move="rollout->train", num_devices=1),
        ] if policy == "static" else []
        cfg.faults.kill = [KillEntry(device=7 if kill == "train" else 0, step=1, at=kill)]
        validate(cfg, check_machine=False)
        run = harness.run_config(cfg, wl, costs)
        assert run.summary["num_faults"] == 1
    assert set(ops(Device)) - used <= {"stop", "abort_reshard"}  # every op ran (almost)
    assert used - set(ops(Device)) <= {"index", "role"}
