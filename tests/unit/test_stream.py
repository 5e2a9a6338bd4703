"""StepStream: streamed micro-batches equal the full step's, ready exactly when complete."""

from __future__ import annotations

import random

import pytest

from dynaresize.samples import assemble_step
from dynaresize.stream import Holdings, StepStream
from dynaresize.train.batching import make_micro_batches
from dynaresize.types import Completion, RequestSpec


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
