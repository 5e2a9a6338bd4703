"""Resize planner (pure): (current allocation, target allocation) → a DAG of fine-grained ops.

Each op is tagged *critical* (the stage waiting for the device is delayed until it is done) or
*deferrable* (runs while the device already works in its new role). design §4:

rollout → train (device d):
    stop_admission(d) → export_inflight(d) → release_kv(d) ─┐
    join_group(G')  (all devices; a cached group costs 0) ───┴→ reshard(G → G') → commit(G')
    deferrable: release_rollout_weights(d)
train → rollout (device d), at an optimizer-step boundary:
    join_group(G') → reshard(G → G')  (d's shards flow to the ranks that stay; needed before
                                       *their* next optimizer step, not before d serves)
    load_weights(d, version) → alloc_kv(d) → start_serving(d)   (overlapping the reshard)
    reshard, alloc_kv → commit(G');  deferrable: drop_trainer(d)

`commit` is the point of no return: everything before it can be rolled back (the old trainers
stay intact until then; a device that already serves stops and its requests are requeued),
so a resize either completes or leaves the old allocation. The critical path of a
train → rollout move, for the rollout stage, is load_weights → alloc_kv → start_serving.

Which devices move is a pure function of the allocation (rollout → train: the highest-index
rollout devices; train → rollout: the lowest-index training devices), so the live run and the
simulator produce the same sequence of allocations and ops; a controller move may ask for the
rollout devices with nothing left to run first (`prefer`), which then depends on timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynaresize.core.allocation import Allocation
from dynaresize.core.types import Role

GROUP = -1
"""`Op.device` of an op that involves a whole group rather than one device."""


@dataclass(frozen=True)
class Op:
    id: int
    kind: str
    device: int
    critical: bool
    deps: tuple[int, ...] = ()


@dataclass(frozen=True)
class ResizePlan:
    source: Allocation
    target: Allocation
    to_train: tuple[int, ...]
    to_rollout: tuple[int, ...]
    ops: tuple[Op, ...]

    @property
    def old_train(self) -> tuple[int, ...]:
        return self.source.train

    @property
    def new_train(self) -> tuple[int, ...]:
        return self.target.train

    def kinds(self) -> list[str]:
        return [op.kind for op in self.ops]


def choose_devices(alloc: Allocation, move: str, num_devices: int,
                   prefer: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The devices that move (deterministic, see module docstring); rollout->train takes the
    rollout devices in `prefer` first (e.g. engines with nothing left to run)."""
    if move == "rollout->train":
        pool = alloc.rollout
        first = [d for d in prefer if d in pool][:max(0, num_devices)]
        taken = set(first)
        others = [d for d in pool if d not in taken]
        need = num_devices - len(first)
        chosen = tuple(sorted(first + (others[len(others) - need:] if need > 0 else [])))
        remaining = len(pool) - num_devices
    elif move == "train->rollout":
        pool = alloc.train
        chosen = pool[:num_devices]
        remaining = len(pool) - num_devices
    else:
        raise ValueError(f"move = {move!r}: allowed 'rollout->train', 'train->rollout'")
    if num_devices <= 0 or remaining < 1:
        raise ValueError(f"{move} x{num_devices} would leave {remaining} devices in the "
                         f"{'rollout' if move.startswith('rollout') else 'train'} pool "
                         f"({alloc.describe()}); each pool needs at least 1")
    return tuple(chosen)


def target_allocation(alloc: Allocation, move: str, num_devices: int,
                      prefer: tuple[int, ...] = ()) -> Allocation:
    devices = choose_devices(alloc, move, num_devices, prefer)
    role = Role.TRAIN if move == "rollout->train" else Role.ROLLOUT
    return alloc.with_roles({d: role for d in devices})


def plan_resize(source: Allocation, target: Allocation) -> ResizePlan:
    """The op DAG that takes `source` to `target` (devices switch between rollout and train)."""
    if source.num_devices != target.num_devices:
        raise ValueError("source and target allocations cover different devices")
    to_train = tuple(d for d in range(source.num_devices)
                     if source.roles[d] is Role.ROLLOUT and target.roles[d] is Role.TRAIN)
    to_rollout = tuple(d for d in range(source.num_devices)
                       if source.roles[d] is Role.TRAIN and target.roles[d] is Role.ROLLOUT)
    if not target.rollout or not target.train:
        raise ValueError(f"target {target.describe()} empties a pool")
    ops: list[Op] = []

    def add(kind: str, device: int, critical: bool, *deps: int) -> int:
        ops.append(Op(len(ops), kind, device, critical, tuple(deps)))
        return len(ops) - 1

    released: list[int] = []
    for d in to_train:
        stop = add("stop_admission", d, True)
        export = add("export_inflight", d, True, stop)
        released.append(add("release_kv", d, True, export))
    if not to_train and not to_rollout:
        return ResizePlan(source, target, to_train, to_rollout, ())
    join = add("join_group", GROUP, True)
    reshard = add("reshard", GROUP, True, join, *released)
    prepared = []
    for d in to_rollout:  # overlaps the reshard: d's shards stream out while it gets ready
        load = add("load_weights", d, True)
        prepared.append(add("alloc_kv", d, True, load))
        add("start_serving", d, True, prepared[-1])
    commit = add("commit", GROUP, True, reshard, *prepared)
    for d in to_train:
        add("release_rollout_weights", d, False, commit)
    for d in to_rollout:
        add("drop_trainer", d, False, commit)
    return ResizePlan(source, target, to_train, to_rollout, tuple(ops))


def ready_ops(plan: ResizePlan) -> tuple[int, ...]:
    """Ops after which the moved devices work in their new role: `commit` for devices joining
    training, `start_serving` for devices joining rollout."""
    return tuple(op.id for op in plan.ops
                 if (op.kind == "commit" and plan.to_train) or op.kind == "start_serving")


def _finish_times(plan: ResizePlan, durations_s: dict[int, float]
                  ) -> tuple[dict[int, float], dict[int, int | None]]:
    finish: dict[int, float] = {}
    parent: dict[int, int | None] = {}
    for op in plan.ops:  # ops are in topological order by construction
        best = max(op.deps, key=lambda d: finish[d], default=None)
        start = finish[best] if best is not None else 0.0
        finish[op.id] = start + (durations_s.get(op.id, 0.0) if op.critical else 0.0)
        parent[op.id] = best
    return finish, parent


def critical_chain(plan: ResizePlan, durations_s: dict[int, float]) -> tuple[float, set[int]]:
    """The critical path (design §4: what delays the stage that waits for the moved devices):
    the longest chain of critical ops ending where a moved device is ready. Returns its
    length and the ids of the critical ops on it."""
    finish, parent = _finish_times(plan, durations_s)
    ends = ready_ops(plan)
    if not ends:
        return 0.0, set()
    node: int | None = max(ends, key=lambda i: finish[i])
    length = finish[node]
    chain: set[int] = set()
    while node is not None:
        if plan.ops[node].critical:
            chain.add(node)
        node = parent[node]
    return length, chain


def critical_path_s(plan: ResizePlan, durations_s: dict[int, float]) -> float:
    return critical_chain(plan, durations_s)[0]


def group_ready_s(plan: ResizePlan, durations_s: dict[int, float]) -> float:
    """When the new training group holds its state (`commit` done): what the remaining
    trainers' next optimizer step waits for."""
    finish, _ = _finish_times(plan, durations_s)
    return max((finish[op.id] for op in plan.ops if op.kind == "commit"), default=0.0)
