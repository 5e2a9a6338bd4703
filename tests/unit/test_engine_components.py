"""The engine pool's components: `EnginePool` offers every member the narrow protocols of its
resize hooks and tail rescue name (signature for signature), `EngineRescue` the hooks' rescue,
`ResizeHooks` the resize executor's hooks; and `EngineTransit` keeps each set in transit."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from dynaresize.orchestrator.engine_hooks import HookedPool, ResizeHooks, TailRescue
from dynaresize.orchestrator.engine_pool import EnginePool
from dynaresize.orchestrator.engine_rescue import EngineRescue, RescuedPool
from dynaresize.orchestrator.engine_transit import EngineTransit
from dynaresize.resize import executor


def members(proto: type) -> dict[str, Any]:
    return {name: value for name, value in vars(proto).items()
            if not name.startswith("_") and (inspect.isfunction(value)
                                             or isinstance(value, property))}


@pytest.mark.parametrize(("proto", "cls"), [(HookedPool, EnginePool), (RescuedPool, EnginePool),
                                            (TailRescue, EngineRescue),
                                            (executor.ResizeHooks, ResizeHooks)])
def test_components_offer_what_their_users_name(proto: type, cls: type) -> None:
    pool = EnginePool(None, None, None, None, EngineTransit())  # type: ignore[arg-type]
    assert members(proto)
    for name, want in members(proto).items():
        if isinstance(want, property):  # an attribute the pool sets (`run`, `tails`)
            assert cls is EnginePool and hasattr(pool, name), name
            continue
        got = getattr(cls, name)
        assert inspect.signature(got) == inspect.signature(want), name
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(want), name


def test_transit_sets_change_only_through_their_methods() -> None:
    transit = EngineTransit()
    transit.add_arriving(3)
    token = transit.start_rescue(7)
    assert token == -8 and transit.has_arriving()
    assert transit.arriving() == {3} and transit.in_transit() == {3, -8}
    with transit.borrowing(5), transit.loading_for_step({1, 2}):
        assert transit.in_transit() == {3, -8, 5} and transit.loading == {1, 2}
    assert transit.in_transit() == {3, -8} and not transit.loading
    transit.end_rescue(token)
    transit.arrived(3)
    assert not transit.has_arriving() and transit.arriving() == set()
    transit.leave(4)
    transit.serve(6, early=True)
    transit.serve(4, early=False)  # a rolled-back resize brings a stopped device back
    assert transit.leaving == set() and transit.serving_early == {6}
    transit.leave(6)
    transit.forget({6})
    assert transit.leaving == set() and transit.serving_early == set()
