"""StepStream: streamed micro-batches equal the full step's, ready exactly when complete."""

from __future__ import annotations

import asyncio
import random

import pytest

from dynaresize.core.samples import assemble_step
from dynaresize.core.stream import Holdings, StepStream
from dynaresize.core.types import Completion, RequestSpec
from dynaresize.train.batching import make_micro_batches


def _completion(step: int, prompt: int, sample: int, version: int = 0,
                length: int = 3) -> Completion:
    spec = RequestSpec(step=step, prompt=prompt, sample=sample, version=version,
                       prompt_tokens=(1, 2), max_new_tokens=8, seed=prompt * 100 + sample,
                       temperature=1.0)
    tokens = [prompt + sample + i for i in range(length)]
    return Completion(spec, tokens, [-0.5] * length, "eos", device=0, engine_version=version)


@pytest.mark.parametrize("micro_batch_size", [2, 4, 6, 12])
def test_streamed_micro_batches_equal_the_full_steps(micro_batch_size: int) -> None:
    prompts, n = [7, 3, 11], 4
    comps = [_completion(1, p, j, length=1 + (p * j) % 5) for p in prompts for j in range(n)]
    rewards = {(c.spec.prompt, c.spec.sample): float((c.spec.prompt + c.spec.sample) % 3)
               for c in comps}
    stream = StepStream(1, 0, prompts, n, micro_batch_size)
    order = comps[:]
    random.Random(0).shuffle(order)
    for c in order:
        newly = stream.add(c, rewards[(c.spec.prompt, c.spec.sample)])
        for m in newly:  # ready means: every sample of it exists
            assert len(stream.micro_batch(m)) == micro_batch_size
    assert stream.complete
    expected = {(p, j) for p in prompts for j in range(n)}
    full = assemble_step(1, 0, expected, comps, rewards, 0.0)
    reference = make_micro_batches(full.samples, micro_batch_size)
    assert [stream.micro_batch(m) for m in range(stream.num_micro_batches)] == reference
    assert sorted(stream.ready) == list(range(len(reference)))
    # assembling the step from the stream's samples (not rebuilding them) changes nothing
    reused = assemble_step(1, 0, expected, comps, rewards, 0.0, built=stream.samples)
    assert reused.samples == full.samples and list(reused.records) == list(full.records)
    assert all(a is stream.samples[(a.prompt, a.sample)] for a in reused.samples)


def test_a_micro_batch_waits_for_its_whole_group() -> None:
    stream = StepStream(0, 0, [0, 1], 4, 2)  # micro-batches: (0,0-1) (0,2-3) (1,0-1) (1,2-3)
    assert stream.add(_completion(0, 0, 0), 1.0) == []
    assert stream.add(_completion(0, 0, 1), 0.0) == []  # its group is not complete yet
    assert stream.add(_completion(0, 0, 2), 1.0) == []
    assert sorted(stream.add(_completion(0, 0, 3), 0.0)) == [0, 1]
    assert not stream.complete


def test_wrong_version_duplicate_and_unknown_prompt_are_refused() -> None:
    stream = StepStream(2, 1, [0], 2, 2)
    with pytest.raises(RuntimeError, match="version"):
        stream.add(_completion(2, 0, 0, version=0), 1.0)
    stream.add(_completion(2, 0, 0, version=1), 1.0)
    with pytest.raises(RuntimeError, match="twice"):
        stream.add(_completion(2, 0, 0, version=1), 1.0)
    with pytest.raises(RuntimeError, match="not in the batch"):
        stream.add(_completion(2, 5, 0, version=1), 1.0)
    with pytest.raises(ValueError, match="split"):
        StepStream(0, 0, [0], 3, 2)


def test_holdings_forget_what_departed_devices_held() -> None:
    h = Holdings({0: 4, 1: 5, 2: 4})
    assert h.todo([0, 1, 2, 3]) == [3]
    assert sorted(h.drop_devices([5])) == [0, 2]
    assert h.todo([0, 1, 2, 3]) == [0, 2, 3]


def test_holdings_forget_what_a_device_held_before_it_left_training_and_came_back() -> None:
    # device 5 accumulated micro-batch 0, then two resizes between sessions took it to the
    # rollout and back: its trainer is new and holds nothing (its tenure went 0 -> 1)
    h = Holdings()
    h.drop_devices([4, 5], {})
    h.hold(0, 5)
    h.hold(1, 4)
    assert h.drop_devices([4, 5], {5: 1}) == [0]
    assert h.todo([0, 1]) == [0]
    h.hold(0, 5)  # accumulated again in its new tenure: kept
    assert h.drop_devices([4, 5], {5: 1}) == []


def test_a_resize_that_brings_a_device_back_to_training_counts_a_new_tenure() -> None:
    from dynaresize.core.allocation import Allocation
    from dynaresize.core.types import Role
    from dynaresize.orchestrator.state import RunState

    state = RunState([], Allocation.initial(2, 2), 0)  # rollout 0, 1; train 2, 3
    swapped = state.allocation.with_roles({2: Role.ROLLOUT, 1: Role.TRAIN})
    state.commit_allocation(swapped)
    assert state.train_tenure == {1: 1}
    state.commit_allocation(swapped.with_roles({2: Role.TRAIN}))  # 2 comes back
    assert state.train_tenure == {1: 1, 2: 1}


def test_remaining_work_counts_tokens_not_micro_batches() -> None:
    # prompt 0's group is short, prompt 1's long: with prompt 0's micro-batch trained, half
    # the micro-batches but far less than half the tokens are done
    stream = StepStream(0, 0, [0, 1], 2, 2)
    assert stream.todo_fraction([]) == 1.0
    for j in range(2):
        stream.add(_completion(0, 0, j, length=2), 1.0)  # 2 samples x (2 prompt + 2) tokens
    assert stream.micro_batch_tokens(0) == 8
    # the other micro-batch is not ready: it counts the mean of the ready ones
    assert stream.todo_fraction([0]) == pytest.approx(0.5)
    for j in range(2):
        stream.add(_completion(0, 1, j, length=22), 1.0)  # 2 x (2 + 22) tokens
    assert stream.micro_batch_tokens(1) == 48
    assert stream.todo_fraction([0]) == pytest.approx(48 / 56)
    assert stream.todo_fraction([0, 1]) == 0.0


def test_ready_profile_says_when_the_training_work_became_ready() -> None:
    stream = StepStream(0, 0, [0, 1], 2, 2)
    assert stream.ready_profile(0.0, 10.0) == ()  # incomplete
    for j in range(2):
        stream.add(_completion(0, 0, j, length=2), 1.0, now_s=1.5)  # 8 tokens at 15 %
    for j in range(2):
        stream.add(_completion(0, 1, j, length=10), 1.0, now_s=9.0)  # 24 tokens at 90 %
    profile = stream.ready_profile(0.0, 10.0, points=4)
    assert profile == pytest.approx((0.25, 0.25, 0.25, 1.0))


class _Events:
    def event(self, *args: object, **kw: object) -> None:
        return None


class _Trainer:
    """Accumulates a micro-batch in 0.01 s per token; the first one taken raises `stop`."""

    def __init__(self, index: int, clock: object, stream: StepStream, stop: list[bool]) -> None:
        self.index, self.clock, self.stream, self.stop = index, clock, stream, stop
        self.took: list[int] = []

    async def train_accumulate(self, step: int, mbs: list) -> None:
        (m, _), = mbs
        self.took.append(m)
        self.stop[0] = True  # a resize starts waiting once the first micro-batch runs
        await self.clock.sleep(0.01 * self.stream.micro_batch_tokens(m))


def _ready_stream(lengths: list[int]) -> StepStream:
    """One micro-batch per prompt (2 samples of `length` + 2 prompt tokens each), all ready."""
    stream = StepStream(0, 0, list(range(len(lengths))), 2, 2)
    for p, length in enumerate(lengths):
        for j in range(2):
            stream.add(_completion(0, p, j, length=length), 1.0)
    return stream


@pytest.mark.parametrize("backfill", [True, False])
def test_while_a_resize_waits_free_trainers_only_take_what_ends_in_time(backfill: bool) -> None:
    """Once a resize waits for the boundary, the session ends when the micro-batches in
    flight do; meanwhile a free trainer takes ready micro-batches expected to end by then
    (backfill, at the measured seconds per token) and never one that would delay it."""
    from dynaresize.orchestrator.streaming import TrainRate, train_session
    from dynaresize.sim.clock import VirtualClock

    clock = VirtualClock()
    stream = _ready_stream([73, 48, 3, 98])
    # tokens: m0 150 (1.5 s), m1 100 (1 s), m2 10 (0.1 s), m3 200 (2 s)
    stop = [False]
    trainers = [_Trainer(i, clock, stream, stop) for i in range(2)]
    holdings = Holdings()
    rate = TrainRate()
    rate.add(1.0, 100)  # measured earlier in the step: 0.01 s per token
    spent = clock.run(train_session(clock, _Events(), 0, stream, holdings,  # type: ignore
                                    trainers, asyncio.Event(), lambda: stop[0],  # type: ignore
                                    rate if backfill else None))
    assert clock.now() == pytest.approx(2.0)      # the resize waited for m3 only
    assert trainers[0].took == [3]                # the largest first
    assert trainers[1].took == ([0, 2] if backfill else [])   # m1 would end at 2.5 s
    assert sorted(holdings.held_by) == ([0, 2, 3] if backfill else [3])
    assert spent == pytest.approx(3.6 if backfill else 2.0)


def test_trainers_take_the_largest_ready_micro_batch_first() -> None:
    """Micro-batches ready at once (staleness 1: the whole step) go largest first, as LPT:
    four small ones then a large one, on two trainers, end at 4 s (the large one beside the
    four small ones), not at 6 s (in readiness order the large one comes last)."""
    from dynaresize.orchestrator.streaming import train_session
    from dynaresize.sim.clock import VirtualClock

    clock = VirtualClock()
    stream = _ready_stream([48, 48, 48, 48, 198])     # 100 tokens (1 s) x 4, then 400 (4 s)
    trainers = [_Trainer(i, clock, stream, [False]) for i in range(2)]
    clock.run(train_session(clock, _Events(), 0, stream, Holdings(), trainers,  # type: ignore
                            asyncio.Event(), lambda: False))
    assert clock.now() == pytest.approx(4.0)
    assert trainers[0].took == [4] and trainers[1].took == [0, 1, 2, 3]


def test_a_step_measures_the_spread_of_its_response_lengths() -> None:
    """`StepSamples.response_cv` (what the controller's lending gate reads): std / mean of
    the response lengths; 0 for equal lengths (measured: not "unknown", which is None)."""
    expected = {(0, j) for j in range(4)}
    rewards = {key: 0.0 for key in expected}

    def cv(lengths: list[int]) -> float | None:
        comps = [_completion(0, 0, j, length=n) for j, n in enumerate(lengths)]
        return assemble_step(0, 0, expected, comps, rewards, 0.0).response_cv

    assert cv([5, 5, 5, 5]) == 0.0
    assert cv([2, 4, 6, 8]) == pytest.approx((5 ** 0.5) / 5)  # std sqrt(5), mean 5
    assert cv([1, 1, 1, 13]) == pytest.approx(27 ** 0.5 / 4)  # std sqrt(27), mean 4


def test_token_budgeted_stream_cuts_each_group_as_it_completes() -> None:
    """With a token budget the stream's micro-batches and their (sparse) indices are the
    balanced plan's (`train.balance`), each known when its group completes."""
    from dynaresize.train.balance import num_slots, token_micro_batches

    prompts, n, budget = [7, 3, 11], 4, 12
    comps = [_completion(1, p, j, length=1 + (p * j) % 9) for p in prompts for j in range(n)]
    rewards = {(c.spec.prompt, c.spec.sample): float(c.spec.sample % 2) for c in comps}
    stream = StepStream(1, 0, prompts, n, 2, max_tokens_per_micro_batch=budget)
    order = comps[:]
    random.Random(1).shuffle(order)
    first_group_done = False
    for c in order:
        newly = stream.add(c, rewards[(c.spec.prompt, c.spec.sample)])
        if newly and not first_group_done:
            first_group_done = True
            assert not stream.complete and 0 < stream.todo_fraction([]) <= 1.0
    assert stream.complete and stream.num_micro_batches == num_slots(3, n)
    full = assemble_step(1, 0, {(p, j) for p in prompts for j in range(n)}, comps, rewards, 0.0)
    reference = token_micro_batches(full.samples, budget)
    assert len(reference) > len(prompts)                      # some group was cut
    assert stream.num_formed == len(reference)  # what the controller counts (train_s)
    assert sorted(stream.ready) == [m for m, _ in reference]
    assert [stream.micro_batch(m) for m, _ in reference] == [mb for _, mb in reference]
    assert stream.todo_fraction(stream.ready) == 0.0


def test_dynamic_sampling_streams_exactly_the_kept_groups() -> None:
    """keep_groups (dynamic sampling): the ready micro-batches are those of the kept groups'
    samples, in the same index order as the balanced plan of the assembled step."""
    from dynaresize.core.dynamic_sampling import assemble_dynamic
    from dynaresize.train.balance import token_micro_batches

    pool, n, budget, keep = [2, 5, 8, 9, 13, 20], 4, 12, 3
    comps = [_completion(1, p, j, length=1 + (p * j) % 9) for p in pool for j in range(n)]
    # prompts 2 and 9: all rewards equal (no signal); the others vary
    rewards = {(c.spec.prompt, c.spec.sample):
               1.0 if c.spec.prompt in (2, 9) else float(c.spec.sample % 2) for c in comps}
    for seed in range(5):
        stream = StepStream(1, 0, pool, n, 2, max_tokens_per_micro_batch=budget,
                            keep_groups=keep)
        stream.grow(len(pool))  # every prompt of the stream dispatched
        order = comps[:]
        random.Random(seed).shuffle(order)
        for c in order:
            stream.add(c, rewards[(c.spec.prompt, c.spec.sample)])
        assert not stream.complete  # until the batch is known (`seal`)
        stream.seal(len(pool))
        assert stream.complete
        got, rate = assemble_dynamic(1, 0, pool, comps, rewards, n, keep, 0.0)
        assert rate == pytest.approx(2 / 6)
        assert sorted({s.prompt for s in got.samples}) == [5, 8, 13]
        reference = token_micro_batches(got.samples, budget)
        assert [stream.micro_batch(m) for m in sorted(stream.ready)] == \
            [mb for _, mb in reference]
        kept = {r["prompt"]: r["kept"] for r in got.records}
        assert kept == {2: False, 5: True, 8: True, 9: False, 13: True, 20: False}


class _DyingTrainer(_Trainer):
    """Its first micro-batch fails half-way, as a killed device's call does."""

    async def train_accumulate(self, step: int, mbs: list) -> None:
        (m, _), = mbs
        self.took.append(m)
        await self.clock.sleep(0.5)
        raise RuntimeError(f"device {self.index} died")


def test_a_trainer_death_ends_the_session_for_every_trainer() -> None:
    """Found live (`bench/chaos_live.py --mode trap`): when one trainer's micro-batch failed,
    the others went on pulling micro-batches, also after the repair had rebuilt them, and
    the replay of the step met the gradients they held. Now the session's other pulls are
    cancelled with it: nothing is taken after the death."""
    from dynaresize.orchestrator.streaming import train_session
    from dynaresize.sim.clock import VirtualClock

    clock = VirtualClock()
    stream = _ready_stream([48, 48, 48, 48, 48, 48])  # 1 s each
    survivor, dying = _Trainer(0, clock, stream, [False]), _DyingTrainer(1, clock, stream,
                                                                          [False])

    async def scenario() -> float:
        with pytest.raises(RuntimeError, match="device 1 died"):
            await train_session(clock, _Events(), 0, stream, Holdings(),  # type: ignore
                                [survivor, dying], asyncio.Event(), lambda: False)
        end_s = clock.now()
        await clock.sleep(10.0)  # a pull left running would take more meanwhile
        return end_s

    assert clock.run(scenario()) == pytest.approx(0.5)
    assert len(survivor.took) == 1 and len(dying.took) == 1
