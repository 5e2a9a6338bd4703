"""Streaming a step's training over its completed sample groups (pure bookkeeping).

With streaming on (`controller.stream_training`, a policy that supports it), the training of
step k does not wait for the step's last request: its micro-batches are the same as
`batching.make_micro_batches` would cut from the full step (sorted by (prompt, sample), chunks of
`micro_batch_size`), fixed before the rollout starts, and micro-batch `m` becomes *ready* once
every GRPO group it touches is complete (advantages are per group). Training ranks accumulate
ready micro-batches as they come (`Device.train_accumulate`) while the rollout tail finishes;
the optimizer step (`Device.train_finish`) waits for all of them. The update is the same
function of the step's samples as without streaming (design §2.4): the composition of every
micro-batch and the global token count do not depend on when groups finish.

With a token budget (`train.max_tokens_per_micro_batch` > 0) the micro-batches are those of
`train.balance`: each group is cut into token-budgeted micro-batches when it completes, with
sparse global indices (`balance.slot_index`) known at once; `num_micro_batches` is then the
index space (`balance.num_slots`), of which the empty slots are skipped at the finish.

`StepStream` is the per-step state: which samples exist, which micro-batches are ready, and
which training rank holds each accumulated micro-batch (`Holdings`). No asyncio, no devices.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dynaresize.core.advantages import AdvantageSpec
from dynaresize.core.dynamic_sampling import KeepTracker, has_signal
from dynaresize.core.samples import group_samples
from dynaresize.core.types import Completion, TrainSample
from dynaresize.train.balance import cut_group, num_slots, slot_index


class StepStream:
    """Micro-batches of one step as their groups complete (module docstring)."""

    def __init__(self, step: int, version: int, prompt_ids: Sequence[int],
                 samples_per_prompt: int, micro_batch_size: int,
                 max_tokens_per_micro_batch: int = 0,
                 advantage_spec: AdvantageSpec | None = None, keep_groups: int = 0) -> None:
        """`keep_groups` > 0 (dynamic sampling, token budget only): `prompt_ids` is the
        step's whole prompt stream (its order); only the groups `dynamic_sampling.KeepTracker`
        releases train; `grow` counts the dispatched groups, `seal` ends the step."""
        if micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be > 0, got {micro_batch_size}")
        keys = [(p, j) for p in sorted(prompt_ids) for j in range(samples_per_prompt)]
        self.max_tokens = max_tokens_per_micro_batch
        if not self.max_tokens and len(keys) % micro_batch_size:
            raise ValueError(f"{len(keys)} samples do not split into micro-batches of "
                             f"{micro_batch_size}")
        self.step = step
        self.version = version
        self.advantage_spec = advantage_spec
        if keep_groups and not self.max_tokens:
            raise ValueError("dynamic sampling streams token-budgeted micro-batches only")
        self._tracker = KeepTracker(prompt_ids, keep_groups) if keep_groups else None
        self.samples_per_prompt = samples_per_prompt
        self._position = {p: i for i, p in enumerate(sorted(prompt_ids))}
        self._mb_keys: dict[int, list[tuple[int, int]]] = {}
        """Micro-batch index -> its (prompt, sample) keys (token budget: once its group is
        complete)."""
        self._mbs_of_prompt: dict[int, list[int]] = {p: [] for p in prompt_ids}
        if not self.max_tokens:
            for m, i in enumerate(range(0, len(keys), micro_batch_size)):
                self._mb_keys[m] = keys[i:i + micro_batch_size]
                for prompt in dict.fromkeys(p for p, _ in self._mb_keys[m]):
                    self._mbs_of_prompt[prompt].append(m)
        self._num_groups_left = 0 if keep_groups else len(self._position)
        self._sealed = not keep_groups
        self._missing_prompts = {m: len({p for p, _ in mb}) for m, mb in self._mb_keys.items()}
        self._pending: dict[int, dict[int, tuple[Completion, float]]] = {}
        self._samples: dict[tuple[int, int], TrainSample] = {}
        self._ready: list[int] = []
        self._sample_tokens: dict[tuple[int, int], int] = {}
        self._mb_tokens: dict[int, int] = {}
        """Ready micro-batch -> its tokens (prompt + response of every sample)."""
        self._ready_tokens = 0
        self._ready_s: list[tuple[float, int]] = []
        """(when, tokens) each time micro-batches became ready (`add`'s `now_s`)."""

    @property
    def num_micro_batches(self) -> int:
        """What the optimizer step's `train_finish` gets: the micro-batch count, or with a
        token budget the index space (`balance.num_slots`)."""
        if self.max_tokens:
            return num_slots(len(self._position), self.samples_per_prompt)
        return len(self._mb_keys)

    @property
    def num_formed(self) -> int:
        """Micro-batches formed so far (with a token budget, each group's once it is
        complete): all of the step's once it is `complete`."""
        return len(self._mb_keys)

    @property
    def complete(self) -> bool:
        return self._num_groups_left == 0 and self._sealed

    def grow(self, num_groups: int) -> None:
        """Dynamic sampling: `num_groups` more groups of the stream were dispatched."""
        self._num_groups_left += num_groups

    def seal(self, batch_size: int, now_s: float | None = None) -> list[int]:
        """Dynamic sampling: every dispatched group is complete and the batch is the first
        `batch_size` prompts of the stream; returns the micro-batches this made ready."""
        assert self._tracker is not None and self._num_groups_left == 0
        self._sealed = True
        return self._release(self._tracker.seal(batch_size), now_s)

    @property
    def ready(self) -> list[int]:
        """Ready micro-batch indices, in the order they became ready."""
        return self._ready

    def add(self, completion: Completion, reward: float,
            now_s: float | None = None) -> list[int]:
        """Record one completion (at time `now_s`, if given: `ready_profile`); returns the
        micro-batches it made ready. Checks design §2.2 (the step's fixed version) before
        anything can train on it."""
        spec = completion.spec
        if not spec.step == self.step or not spec.version == self.version \
                == completion.engine_version:
            raise RuntimeError(f"step {self.step} sample {(spec.prompt, spec.sample)}: step "
                               f"{spec.step}, generated by version {completion.engine_version}, "
                               f"the step needs {self.version}")
        if spec.prompt not in self._mbs_of_prompt:
            raise RuntimeError(f"step {self.step}: prompt {spec.prompt} is not in the batch")
        group = self._pending.setdefault(spec.prompt, {})
        if spec.sample in group or (spec.prompt, spec.sample) in self._samples:
            raise RuntimeError(f"step {self.step}: sample {(spec.prompt, spec.sample)} "
                               "completed twice")
        group[spec.sample] = (completion, reward)
        if len(group) < self.samples_per_prompt:
            return []
        del self._pending[spec.prompt]
        self._add_group(spec.prompt, [group[j] for j in range(self.samples_per_prompt)])
        self._num_groups_left -= 1
        for j, (c, _) in group.items():
            self._sample_tokens[(spec.prompt, j)] = c.num_prompt_tokens + c.num_tokens
        released = [spec.prompt]
        if self._tracker is not None:
            rewards = [r for _, r in group.values()]
            released = self._tracker.complete(spec.prompt, has_signal(rewards))
        return self._release(released, now_s)

    def _release(self, released: list[int], now_s: float | None) -> list[int]:
        """Groups that train: cut (token budget) and mark their micro-batches ready."""
        if self.max_tokens:
            for prompt in released:
                self._cut(prompt)
        newly = []
        for m in (m for prompt in released for m in self._mbs_of_prompt[prompt]):
            self._missing_prompts[m] -= 1
            if self._missing_prompts[m] == 0:
                newly.append(m)
                tokens = sum(self._sample_tokens[key] for key in self._mb_keys[m])
                self._mb_tokens[m] = tokens
                self._ready_tokens += tokens
        self._ready.extend(newly)
        if newly and now_s is not None:
            self._ready_s.append((now_s, sum(self._mb_tokens[m] for m in newly)))
        return newly

    def ready_profile(self, start_s: float, end_s: float,
                      points: int = 10) -> tuple[float, ...]:
        """The share of the step's training tokens ready by `start_s + i / points` of the
        way to `end_s`, for i = 1..points (the rollout's start and end: how early its
        training could have run). Empty before the step is complete or without times."""
        if not self.complete or not self._ready_s or self._ready_tokens <= 0:
            return ()
        span_s = max(end_s - start_s, 1e-9)
        by_point = [0] * points
        for t, tokens in self._ready_s:
            i = min(points - 1, max(0, math.ceil((t - start_s) / span_s * points) - 1))
            by_point[i] += tokens
        out, total = [], 0
        for tokens in by_point:
            total += tokens
            out.append(total / self._ready_tokens)
        return tuple(out)

    def micro_batch_tokens(self, m: int) -> int:
        """Tokens of ready micro-batch `m` (prompt + response of every sample)."""
        return self._mb_tokens[m]

    def todo_fraction(self, held: Iterable[int]) -> float:
        """The share of the step's training tokens in micro-batches not in `held`: ready
        micro-batches count their tokens, the others the mean of the ready ones (1 each
        before any is ready). Token-weighted, since the last groups to finish are the
        longest: at the rollout's end the micro-batches left hold far more than their count's
        share of the work."""
        num_ready = len(self._ready)
        if self.max_tokens:  # unit: a group (its micro-batches are not cut yet)
            num_done = len(self._samples) // self.samples_per_prompt
            mean = self._ready_tokens / num_done if num_done else 1.0
            total = self._ready_tokens + self._num_groups_left * mean
            done = sum(self._mb_tokens.get(m, 0) for m in held)
            return max(0.0, 1.0 - done / total) if total > 0 else 0.0
        mean = self._ready_tokens / num_ready if num_ready else 1.0
        total = self._ready_tokens + (len(self._mb_keys) - num_ready) * mean
        done = sum(self._mb_tokens.get(m, mean) for m in held)
        return max(0.0, 1.0 - done / total) if total > 0 else 0.0

    def _cut(self, prompt: int) -> None:
        """Token budget: the micro-batches of a group that just completed."""
        keys = [(prompt, j) for j in range(self.samples_per_prompt)]
        start = 0
        counts = [self._sample_tokens[key] for key in keys]
        for chunk, size in enumerate(cut_group(counts, self.max_tokens)):
            m = slot_index(self._position[prompt], self.samples_per_prompt, chunk)
            self._mb_keys[m] = keys[start:start + size]
            self._missing_prompts[m] = 1
            self._mbs_of_prompt[prompt].append(m)
            start += size

    def _add_group(self, prompt: int, group: list[tuple[Completion, float]]) -> None:
        for s in group_samples(self.step, self.version, prompt, [c for c, _ in group],
                               [r for _, r in group], self.advantage_spec):
            self._samples[(prompt, s.sample)] = s

    @property
    def samples(self) -> dict[tuple[int, int], TrainSample]:
        """(prompt, sample) → training sample, for every complete group so far."""
        return self._samples

    def micro_batch(self, m: int) -> list[TrainSample]:
        """Micro-batch `m` (ready ones only)."""
        return [self._samples[key] for key in self._mb_keys[m]]


@dataclass
class Holdings:
    """Which training rank holds each accumulated micro-batch of the step being trained."""

    held_by: dict[int, int] = field(default_factory=dict)
    """micro-batch index -> device index."""
    tenure: dict[int, int] = field(default_factory=dict)
    """Trainer -> how many times it joined training (`RunState.train_tenure`), as of the
    last `drop_devices`: a device that left training and came back between two sessions
    holds nothing any more (its trainer is new), though it trains again."""
    held_in: dict[int, int] = field(default_factory=dict)
    """micro-batch index -> its holder's tenure when it was held."""

    def hold(self, m: int, device: int) -> None:
        """`device` accumulated micro-batch `m`'s gradient and holds it."""
        self.held_by[m] = device
        self.held_in[m] = self.tenure.get(device, 0)

    def drop_devices(self, live: Iterable[int], tenure: Mapping[int, int] | None = None
                     ) -> list[int]:
        """Forget what devices no longer training held, or held before they left training
        and came back (`tenure`: the trainers' tenures now); it is recomputed. Returns those
        m."""
        if tenure is not None:
            self.tenure = dict(tenure)
        keep = set(live)
        lost = [m for m, d in self.held_by.items()
                if d not in keep or self.held_in.get(m, 0) != self.tenure.get(d, 0)]
        for m in lost:
            del self.held_by[m]
            self.held_in.pop(m, None)
        return lost

    def clear(self) -> None:
        """The step's optimizer step ran: nothing is held."""
        self.held_by.clear()
        self.held_in.clear()

    def todo(self, ready: Sequence[int]) -> list[int]:
        return [m for m in ready if m not in self.held_by]
