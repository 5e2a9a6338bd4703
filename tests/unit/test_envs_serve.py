"""EngineTurns (envs.serve) when a serve loop dies: every pending and later turn fails with
the loop's error, none waits forever (virtual time: a hang shows as a wait_for timeout)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_turn_engine import FakeEngine  # noqa: E402

from dynaresize.core.types import Completion, RequestSpec  # noqa: E402
from dynaresize.envs.driver import TurnRequest  # noqa: E402
from dynaresize.envs.serve import EngineTurns  # noqa: E402
from dynaresize.sim.clock import VirtualClock  # noqa: E402

HANG_S = 10.0
"""Virtual seconds after which a turn counts as hanging (a healthy one takes < 1)."""


def turn(prompt: int) -> TurnRequest:
    return TurnRequest(RequestSpec(0, prompt, 0, 0, (3, 4, 5), 4, seed=prompt), turn=0)


class BrokenEngine(FakeEngine):
    async def step(self) -> list[Completion]:
        await self.clock.sleep(self.step_s)
        raise RuntimeError("engine fell over")


class StrangerEngine(FakeEngine):
    """Fails outside `step`: returns a completion nobody asked for (the loop's lookup fails)."""

    async def step(self) -> list[Completion]:
        await self.clock.sleep(self.step_s)
        return [Completion(turn(99).spec, [3], [-0.5], "length", self.device, 0)]


def outcomes(engines: list[FakeEngine], clock: VirtualClock, prompts: list[int]) -> list[str]:
    """What each turn of `prompts` (asked one after the other, each after the previous one
    ended) and then the serving block's exit give: 'ok', the error, or 'hang'."""
    seen: list[str] = []

    async def ask(turns: EngineTurns, prompt: int) -> str:
        try:
            await asyncio.wait_for(turns(turn(prompt)), HANG_S)
        except TimeoutError:
            return "hang"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "ok"

    async def main() -> None:
        turns = EngineTurns(engines, clock)
        try:
            async with turns.serving():
                for prompt in prompts:
                    seen.append(await ask(turns, prompt))
        except Exception as exc:
            seen.append(f"exit {type(exc).__name__}: {exc}")
        else:
            seen.append("exit ok")

    clock.run(main())
    return seen


def test_a_dead_serve_loop_fails_the_pending_and_every_later_turn() -> None:
    clock = VirtualClock()
    fell = "RuntimeError: engine fell over"
    assert outcomes([BrokenEngine(clock, device=0)], clock, [0, 1, 2]) == \
        [fell, fell, fell, f"exit {fell}"]


def test_a_loop_failing_outside_step_fails_the_turns_instead_of_hanging_them() -> None:
    clock = VirtualClock()
    stranger = "RuntimeError: engine 0 completed request (0, 99, 0), which no turn awaits"
    assert outcomes([StrangerEngine(clock, device=0)], clock, [0, 1]) == \
        [stranger, stranger, f"exit {stranger}"]


def test_one_dead_loop_fails_the_whole_server_with_its_error() -> None:
    clock = VirtualClock()
    engines = [FakeEngine(clock, device=0, step_s=0.05), BrokenEngine(clock, device=1)]

    async def main() -> list[str]:
        turns = EngineTurns(engines, clock)
        got: list[str] = []
        try:
            async with turns.serving():
                asked = [asyncio.ensure_future(turns(turn(p))) for p in range(2)]  # 0 and 1
                for future in asked:
                    try:
                        await asyncio.wait_for(future, HANG_S)
                        got.append("ok")
                    except Exception as exc:
                        got.append(f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            got.append(f"exit {type(exc).__name__}: {exc}")
        return got

    fell = "RuntimeError: engine fell over"
    assert clock.run(main()) == [fell, fell, f"exit {fell}"]


def test_a_refused_add_leaves_no_turn_in_flight() -> None:
    clock = VirtualClock()

    class Refusing(FakeEngine):
        def add(self, item: object) -> None:
            raise ValueError("request refused")

    async def main() -> str:
        turns = EngineTurns([Refusing(clock, device=0)], clock)
        async with turns.serving():
            for _ in range(2):  # the second is refused again, not 'already in flight'
                try:
                    await asyncio.wait_for(turns(turn(0)), HANG_S)
                except ValueError as exc:
                    last = str(exc)
        return last

    assert clock.run(main()) == "request refused"
