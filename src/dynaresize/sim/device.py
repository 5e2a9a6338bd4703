"""SimDevice: every op of the `Device` protocol in virtual time, charged by a `CostModel`.

Rollout engine model (continuous batching, event-driven): requests wait in a FIFO queue and
are admitted while the engine has a free slot (`max_running_requests`) and KV room for their
context. Between two events the running batch `b` is fixed and the engine runs decode
iterations, each adding one token to every running request, timed in closed form by
`CostModel.decode_span_s`. Events: the next completion (a heap keyed by the iteration at which
each request finishes), the KV cache filling up (the youngest request is preempted back to the
queue head and re-prefilled later, as vLLM's recompute preemption does), or `max_s`. So one
`run_rollout` costs O(log b) per event, and a step O(requests log b), whatever the lengths.

Response lengths come from the `Workload`, looked up by (step, prompt, sample), capped by the
request's `max_new_tokens`. Completions carry a one-token stand-in (`[num_tokens]`) instead of
the response; `SimCompletion.num_tokens` is the true length. Training time comes from the true
lengths too (looked up by the samples' keys), so stand-ins never distort the model.

Recovery ops (`RecoveryOps`): checkpoint save and load charge the rank's share of the training
state through the disk bandwidth, a world rebuild a fixed plus a per-rank cost
(`CostModel.recovery`). Every op's time is charged by the device's `sim.process.SimProcess`,
which can die (`sim.faults`): its calls then fail as a dead Ray actor's do. Each device's
training state (`sim.rank.SimRank`) tracks how many optimizer steps it holds and refuses an op
on the wrong state (a train step of step k on a state that is not after k steps), so a recovery
or resize that loses or double-applies an update fails loudly instead of passing.
"""

from __future__ import annotations

from typing import Any

from dynaresize.core.types import Completion, InflightRequest, RequestSpec, Role, TrainSample
from dynaresize.protocols import Clock, WeightHandle
from dynaresize.sim.costs import CostModel
from dynaresize.sim.device_types import (
    Lengths,
    RolloutRecorder,
    SimCompletion,
    SimInflight,
    reshard_plan,
)
from dynaresize.sim.engine_spec import make_engine
from dynaresize.sim.faults import SimProcesses, SimStorage
from dynaresize.sim.process import SimProcess
from dynaresize.sim.rank import SimRank
from dynaresize.sim.workloads import Workload

__all__ = ["Lengths", "RolloutRecorder", "SimCompletion", "SimDevice", "SimInflight",
           "make_devices"]


class SimDevice:
    """One simulated GPU. Consumes requests / train samples; produces modelled time."""

    def __init__(self, index: int, costs: CostModel, workload: Workload, clock: Clock,
                 role: Role = Role.IDLE, lengths: Lengths | None = None,
                 storage: SimStorage | None = None,
                 recorder: RolloutRecorder | None = None) -> None:
        self.index = index
        self.recorder = recorder
        self.role = role
        self.costs = costs
        self.workload = workload
        self._lengths = lengths if lengths is not None else Lengths(workload)
        self.clock = clock
        self.process = SimProcess(index, clock)
        """Charges its ops virtual time; dies (`SimProcesses.kill`)."""
        self.version = 0
        self.engine = make_engine(index, costs, self._lengths, clock)
        self.train_state = SimRank(index)
        """Its training state: group, optimizer steps, held gradients."""
        self.storage = storage if storage is not None else SimStorage()
        self.has_engine = role is not Role.TRAIN
        """As the live actor's engine: built by `load_weights`/`alloc_kv`, dropped by
        `release_rollout_weights`; `submit` needs it (a trainer has none)."""

    @property
    def train_members(self) -> tuple[int, ...]:
        """The training group this device is a rank of (sorted; empty if none)."""
        return self.train_state.members

    @property
    def train_steps(self) -> int | None:
        """Optimizer steps the training state of this rank holds (None: not a trainer)."""
        return self.train_state.steps

    @property
    def alive(self) -> bool:
        """False once its process was killed (`SimProcesses.kill`)."""
        return self.process.alive

    async def start(self) -> None:
        self.process.check_alive()

    async def stop(self) -> None:
        return None

    # ------------------------------------------------------------------ rollout role
    async def load_weights(self, version: int, weights: WeightHandle) -> None:
        await self.process.spend(self.costs.weight_sync_s())
        self.version = version
        self.role, self.has_engine = Role.ROLLOUT, True

    async def submit(self, requests: list[RequestSpec | InflightRequest]) -> None:
        self.process.check_alive()
        if not self.has_engine:  # as the live actor
            raise AssertionError(f"simulated device {self.index}: no rollout engine on this "
                                 "device")
        if self.recorder is not None:
            self.recorder.submitted(self.index, requests, self.clock.now())
        self.engine.submit(requests)

    async def run_rollout(self, max_s: float, until_empty: bool = False) -> list[Completion]:
        process = self.process
        process.check_alive()
        done, elapsed_s = self.engine.run(max_s, until_empty, self.version)
        await process.spend(elapsed_s)
        if self.recorder is not None:
            self.recorder.finished(self.index, done, self.clock.now(), until_empty)
        return done

    async def export_inflight(self) -> list[InflightRequest]:
        self.process.check_alive()
        out = self.engine.export()
        await self.process.spend(len(out) * self.costs.resize.export_per_request_s)
        return out

    # ------------------------------------------------------------------ resize ops (design §4)
    async def release_kv(self) -> None:
        """Free the KV cache of an empty engine: `release_kv_s`."""
        assert self.engine.is_empty, "release_kv on a busy engine"
        self.role = Role.IDLE
        await self.process.spend(self.costs.resize.release_kv_s)

    async def release_rollout_weights(self) -> None:
        """Drop the engine's weights (deferrable): `release_weights_s`."""
        await self.process.spend(self.costs.resize.release_weights_s)
        self.has_engine = False

    async def alloc_kv(self) -> None:
        """Allocate the KV cache and warm the engine up: `alloc_kv_s + start_serving_s`."""
        await self.process.spend(self.costs.resize.alloc_kv_s + self.costs.resize.start_serving_s)
        self.role, self.has_engine = Role.ROLLOUT, True

    async def join_group(self, members: tuple[int, ...]) -> bool:
        """Communicator cache keyed by the member set: `join_group_first_s` the first time
        this device sees `members`, `join_group_cached_s` after. True if created."""
        created = self.train_state.cache_group(members)
        r = self.costs.resize
        await self.process.spend(r.join_group_first_s if created else r.join_group_cached_s)
        return created

    async def reshard(self, old_members: tuple[int, ...], new_members: tuple[int, ...],
                      generation: int, optimizer_step: int, staging_bytes: int
                      ) -> dict[str, float]:
        """The whole collective's time under the bounded-staging model
        (`CostModel.reshard_plan_s`): every member waits for the busiest one. Returns this
        device's `bytes_sent`."""
        # the same plan for every member: computed once per resize
        wall_s, sent = reshard_plan(self.costs, old_members, new_members, staging_bytes)
        self.train_state.prepare(new_members, optimizer_step)
        await self.process.spend(wall_s, collective=True)
        return {"bytes_sent": float(sent.get(self.index, 0.0))}

    async def commit_train_group(self, new_members: tuple[int, ...]) -> None:
        """Switch to the prepared group (members) or stop training (others): `commit_s`. A
        local swap on each member, as live (no collective: a member dying meanwhile does not
        fail the others' commit)."""
        if self.train_state.commit(new_members):
            self.role = Role.TRAIN
        await self.process.spend(self.costs.resize.commit_s)

    async def abort_reshard(self) -> None:
        """Discard the prepared layout; the old one stays in charge (free)."""
        self.process.check_alive()
        self.train_state.abort()

    async def drop_trainer(self) -> None:
        """Free a former trainer's state (deferrable): `release_weights_s`."""
        await self.process.spend(self.costs.resize.release_weights_s)

    # ------------------------------------------------------------------ train role
    async def join_train_group(self, members: tuple[int, ...], generation: int) -> None:
        self.process.check_alive()
        member, cached = self.train_state.join(members)
        if not member:
            if self.role == Role.TRAIN:
                self.role = Role.IDLE
            return
        r = self.costs.resize
        cost_s = r.join_group_cached_s if cached else r.join_group_first_s
        self.role = Role.TRAIN
        await self.process.spend(cost_s, collective=True)

    def _sample_tokens(self, s: TrainSample) -> int:
        responses, prompts = self._lengths(s.step)
        return prompts[s.prompt] + responses[s.prompt][s.sample]

    def train_step_s(self, micro_batches: list[list[TrainSample] | None]) -> tuple[float, int]:
        """(seconds, tokens) `train_step` charges for these micro-batches."""
        num_tokens = sum(self._sample_tokens(s) for mb in micro_batches if mb for s in mb)
        num_ranks = max(1, len(self.train_state.members))
        return self.costs.train_step_overhead_s + num_tokens * self.costs.train_token_s() \
            / self.costs.dp_efficiency(num_ranks), num_tokens

    async def train_step(self, step: int, micro_batches: list[list[TrainSample] | None],
                         global_num_tokens: int) -> dict[str, float]:
        self.train_state.start_step(step)
        seconds, num_tokens = self.train_step_s(micro_batches)
        await self.process.spend(seconds, collective=True)
        self.train_state.stepped(step)
        return {"loss": 0.0, "num_tokens": float(num_tokens)}

    async def train_accumulate(self, step: int,
                               micro_batches: list[tuple[int, list[TrainSample]]]) -> None:
        self.train_state.hold(step)
        num_tokens = sum(self._sample_tokens(s) for _, mb in micro_batches for s in mb)
        num_ranks = max(1, len(self.train_state.members))
        await self.process.spend(num_tokens * self.costs.train_token_s()
                          / self.costs.dp_efficiency(num_ranks))

    async def train_finish(self, step: int, num_micro_batches: int,
                           global_num_tokens: int) -> dict[str, float]:
        self.train_state.start_finish(step)
        await self.process.spend(self.costs.train_step_overhead_s, collective=True)
        self.train_state.stepped(step)
        return {"loss": 0.0}

    async def publish_weights(self, version: int) -> WeightHandle | None:
        self.train_state.expect(version, "publish_weights")
        await self.process.spend(self.costs.weight_sync_latency_s, collective=True)
        self.version = version
        members = self.train_state.members
        first = not members or self.index == members[0]  # sorted
        return version if first else None

    async def param_checksum(self) -> tuple[float, str]:
        self.process.check_alive()
        return 0.0, "sim"

    # ------------------------------------------------------------------ recovery ops
    async def save_checkpoint(self, path: str) -> dict[str, float]:
        """This rank's share of the training state to disk: `CostModel.recovery.save_s`."""
        if self.train_steps is None:
            raise RuntimeError(f"simulated device {self.index}: save_checkpoint on no trainer")
        rc = self.costs.recovery
        seconds = rc.save_s(self.costs.model, len(self.train_state.members))
        await self.process.spend(seconds, collective=True)
        self.storage.save(path, self.train_steps)
        return {"save_s": seconds, "checkpoint_bytes": rc.checkpoint_bytes(self.costs.model)}

    async def load_checkpoint(self, path: str, optimizer_step: int) -> dict[str, float]:
        """The saved state into this group's sharding: `CostModel.recovery.load_s`."""
        self.process.check_alive()
        self.storage.load(path, optimizer_step)
        seconds = self.costs.recovery.load_s(self.costs.model, len(self.train_state.members))
        await self.process.spend(seconds, collective=True)
        self.train_state.restored(optimizer_step)
        return {"load_s": seconds}

    async def rebuild_world(self, store: int | str, ranks: dict[int, int],
                            train_members: tuple[int, ...], optimizer_step: int,
                            keep_train_state: bool) -> None:
        """A new world over the survivors (`CostModel.recovery.rebuild_world_s`) and a new
        training group (`join_group_first_s`; every cached communicator is gone)."""
        seconds = self.costs.recovery.rebuild_world_s(len(ranks))
        await self.process.spend(seconds + self.costs.resize.join_group_first_s, collective=True)
        if self.train_state.rebuild(train_members, optimizer_step, keep_train_state):
            self.role = Role.TRAIN


def make_devices(num_devices: int, num_rollout: int, costs: CostModel, workload: Workload,
                 clock: Clock, processes: SimProcesses | None = None,
                 recorder: RolloutRecorder | None = None) -> list[Any]:
    """Devices 0..R-1 start as rollout, the rest as training (design §5). They share one
    checkpoint storage; `processes`, if given, is their process table (kills); `recorder`, if
    given, sees their requests and completions."""
    lengths, storage = Lengths(workload), SimStorage()
    devices = [SimDevice(i, costs, workload, clock,
                         Role.ROLLOUT if i < num_rollout else Role.TRAIN, lengths, storage,
                         recorder)
               for i in range(num_devices)]
    for device in devices:
        if processes is not None:
            processes.add(device)
    return devices
