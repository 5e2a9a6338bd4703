"""The pieces of `SimDevice` that are plain data: simulated completions and exported
requests, the engine's request record, the workload-lengths table a run's devices share, the
member-tuple and reshard-plan caches, and the recording hook's protocol (see `sim.device`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.sim.workloads import Workload

if TYPE_CHECKING:
    from dynaresize.sim.costs import CostModel


class RolloutRecorder(Protocol):
    """A hook that sees every request a `SimDevice` is given and every completion it hands
    back, in virtual time (e.g. bench/gap.py's per-request timings)."""

    def submitted(self, device: int, requests: Sequence[RequestSpec | InflightRequest],
                  now_s: float) -> None: ...

    def finished(self, device: int, completions: Sequence[Completion], now_s: float,
                 until_empty: bool) -> None: ...


@dataclass
class SimCompletion(Completion):
    """A finished simulated response: `tokens` is a stand-in, `response_tokens` the length."""

    response_tokens: int = 0

    @property
    def num_tokens(self) -> int:  # type: ignore[override]
        return self.response_tokens

    @property
    def num_prompt_tokens(self) -> int:  # type: ignore[override]
        return self.spec.prompt_tokens[0]  # the twin's stand-in prompt is (its length,)


@dataclass
class SimInflight(InflightRequest):
    """An exported simulated request: `num_generated` tokens done, no token list."""

    num_generated: int = 0

    def num_done(self) -> int:
        return self.num_generated


class EngineRequest:
    __slots__ = ("spec", "prompt_tokens", "target_tokens", "generated", "start_iter", "live")

    def __init__(self, spec: RequestSpec, prompt_tokens: int, target_tokens: int,
                 generated: int) -> None:
        self.spec = spec
        self.prompt_tokens = prompt_tokens
        self.target_tokens = target_tokens
        self.generated = generated
        """Tokens generated before `start_iter` (prefix of a migrated or preempted request)."""
        self.start_iter = 0
        self.live = False


_MEMBER_SETS: dict[int, tuple[Any, tuple[int, ...], frozenset[int]]] = {}


def sorted_members(members: Any) -> tuple[tuple[int, ...], frozenset[int]]:
    """(sorted members, member set) of a member collection, computed once per object: a
    resize hands every device the same tuple, so N devices cost O(N), not O(N^2). Only
    tuples are cached (immutable)."""
    if type(members) is not tuple:
        return tuple(sorted(members)), frozenset(members)
    got = _MEMBER_SETS.get(id(members))
    if got is None or got[0] is not members:
        if len(_MEMBER_SETS) >= 64:
            _MEMBER_SETS.clear()
        got = _MEMBER_SETS[id(members)] = (members, tuple(sorted(members)), frozenset(members))
    return got[1], got[2]


_PLANS: dict[tuple[int, int, int, int],
             tuple[Any, Any, CostModel, tuple[float, dict[int, float]]]] = {}
"""Reshard plans by (cost model, old members, new members, staging) object identity."""


def reshard_plan(costs: CostModel, old_members: tuple[int, ...], new_members: tuple[int, ...],
                 staging_bytes: int) -> tuple[float, dict[int, float]]:
    """`CostModel.reshard_plan_s` of a resize, computed once for all its members (each is
    handed the same member tuples; only tuples are cached)."""
    key = (id(costs), id(old_members), id(new_members), staging_bytes)
    got = _PLANS.get(key)
    if got is None or got[0] is not old_members or got[1] is not new_members \
            or got[2] is not costs or type(old_members) is not tuple \
            or type(new_members) is not tuple:
        if len(_PLANS) >= 64:
            _PLANS.clear()
        got = _PLANS[key] = (old_members, new_members, costs, costs.reshard_plan_s(
            tuple(old_members), tuple(new_members), staging_bytes))
    return got[3]


class Lengths:
    """A workload's lengths per step as Python lists (a list lookup costs a tenth of indexing
    a numpy array), for the last few steps; one table is shared by a run's devices."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._steps: dict[int, tuple[list[list[int]], list[int]]] = {}
        self._spec: Any = None

    def spec_table(self, speculation: Any) -> Any:
        """The run's shared `speculation.SpecTable` (created on first use)."""
        if self._spec is None:
            from dynaresize.sim.speculation import SpecTable
            self._spec = SpecTable(speculation, self)
        return self._spec

    def __call__(self, step: int) -> tuple[list[list[int]], list[int]]:
        """(response tokens [prompt][sample], prompt tokens [prompt]) of `step`."""
        got = self._steps.get(step)
        if got is None:
            if len(self._steps) >= 4:
                self._steps.clear()
            req = self.workload.step_requests(step)
            got = self._steps[step] = (req.response_tokens.tolist(), req.prompt_tokens.tolist())
        return got
