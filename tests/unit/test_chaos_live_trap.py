"""The live chaos campaign's trap (`app.chaos_live`): its draws, and how `LiveTrap` picks and
kills its victims on devices whose roles it only knows from their ops (no Ray here: fake
devices and a fake pool, in milliseconds)."""

from __future__ import annotations

import asyncio

from dynaresize.app.chaos_live import MIN_ALIVE, RESIZE, LiveTrap, describe, draw_live
from dynaresize.core.types import Role
from dynaresize.sim.chaos import FIRST_PHASES, PHASES, Death


class FakeDevice:
    def __init__(self, index: int, role: Role) -> None:
        self.index, self.role = index, role
        for ops in PHASES.values():
            for op in ops:
                setattr(self, op, self._op)

    async def _op(self, *args: object) -> None:
        await asyncio.sleep(0)


class FakePool:
    def __init__(self, n: int) -> None:
        self.dead: set[int] = set()
        self.kills: list[int] = []
        self.n = n

    def kill(self, index: int) -> None:
        self.kills.append(index)
        if index in self.dead:
            raise ProcessLookupError(index)
        self.dead.add(index)

    def is_alive(self, index: int) -> bool:
        return index not in self.dead

    def hang(self, index: int) -> None:
        self.kills.append(-index - 1)   # a freeze, told apart from a kill


def test_draws_are_seeded_and_fit_their_phase() -> None:
    counts = {p: 5 for p in PHASES}
    assert draw_live(3, lambda v: counts) == draw_live(3, lambda v: counts)
    firsts = set()
    for seed in range(60):
        variant, deaths = draw_live(seed, lambda v: counts)
        first = deaths[0]
        firsts.add(first.phase)
        assert first.phase in FIRST_PHASES and 0 <= first.nth < 5 and len(deaths) <= 2
        assert any(v.startswith("run.staleness=") for v in variant)
        if first.phase == "checkpoint":
            assert "run.checkpoint_every=1" in variant
        if first.phase == "resize":
            assert RESIZE in variant
        if len(deaths) == 2 and deaths[1].phase == "recovery":
            assert deaths[1].after == 0
    assert firsts == set(FIRST_PHASES)  # every phase is drawn


async def _run(trap: LiveTrap, devices: list[FakeDevice], calls: list[tuple[int, str]]
               ) -> None:
    for index, op in calls:
        await getattr(devices[index], op)()
    await asyncio.sleep(0.05)  # the kills land after their delay


def test_the_nth_call_of_a_phase_kills_its_caller() -> None:
    devices = [FakeDevice(i, Role.ROLLOUT if i < 2 else Role.TRAIN) for i in range(4)]
    pool = FakePool(4)
    trap = LiveTrap((Death("optimizer", 1, 0.01, "caller"),))
    trap.install(devices, pool)
    asyncio.run(_run(trap, devices, [(2, "train_step"), (3, "train_step"), (0, "run_rollout")]))
    assert pool.kills == [3] and trap.fired == [3]
    assert trap.calls == {"optimizer": 2, "rollout": 1}
    assert "optimizer#1+0.01s caller -> dev 3" in describe(trap.deaths, trap.fired)


def test_roles_come_from_ops_and_enough_devices_stay_alive() -> None:
    devices = [FakeDevice(i, Role.ROLLOUT if i < 2 else Role.TRAIN) for i in range(4)]
    pool = FakePool(4)
    # device 1 moved to training (a resize): its train ops make it a trainer
    deaths = tuple(Death("stream", n, 0.0, "train") for n in range(3))
    trap = LiveTrap(deaths, seed=5)
    trap.install(devices, pool)
    asyncio.run(_run(trap, devices, [(1, "train_accumulate"), (2, "train_accumulate"),
                                     (3, "train_accumulate")]))
    assert trap.roles[1] == Role.TRAIN
    killed = [k for k in trap.fired if k is not None and k >= 0]
    assert len(killed) == 4 - MIN_ALIVE and set(killed) <= {1, 2, 3}
    assert trap.fired.count(-1) == 1  # the third is spared: two devices must live
    assert sorted(pool.dead) == sorted(killed)


def test_a_kill_of_a_process_already_gone_is_ignored() -> None:
    devices = [FakeDevice(i, Role.ROLLOUT if i < 2 else Role.TRAIN) for i in range(4)]
    pool = FakePool(4)
    trap = LiveTrap(())
    trap.install(devices, pool)
    trap.processes.kill(0)
    trap.processes.kill(0)  # the pool raises ProcessLookupError: the trap's kill does not
    assert pool.kills == [0, 0] and not trap.processes.is_alive(0)


def test_the_first_death_is_in_a_phase_the_variant_has() -> None:
    def counts(variant: list[str]) -> dict[str, int]:  # no stream at staleness 0
        c = {p: 4 for p in FIRST_PHASES}
        if "run.staleness=0" in variant:
            c.pop("stream")
        return c

    for seed in range(40):
        variant, deaths = draw_live(seed, counts)
        assert deaths[0].phase in counts(variant)


def test_a_share_of_deaths_freezes_instead() -> None:
    """`hang_p = 1`: the death freezes its victim (`DevicePool.hang`), the table says so;
    `hang_p = 0` never draws from the trial's generator (kill-only trials stay as they were)."""
    devices = [FakeDevice(i, Role.ROLLOUT if i < 2 else Role.TRAIN) for i in range(4)]
    pool = FakePool(4)
    trap = LiveTrap((Death("optimizer", 1, 0.01, "caller"),), hang_p=1.0)
    trap.install(devices, pool)
    asyncio.run(_run(trap, devices, [(2, "train_step"), (3, "train_step")]))
    assert pool.kills == [-4] and trap.hung == [3] and trap.fired == [3]
    assert describe(trap.deaths, trap.fired, tuple(trap.hung)).endswith("-> dev 3 frozen")
    kill_only = LiveTrap((Death("optimizer", 1, 0.01, "caller"),), seed=5)
    state = kill_only.rng.bit_generator.state
    kill_only.install(devices, FakePool(4))
    asyncio.run(_run(kill_only, devices, [(2, "train_step"), (3, "train_step")]))
    assert kill_only.hung == [] and kill_only.rng.bit_generator.state == state
