"""Shared machinery of the twin: a `Config` run on `SimDevice`s in virtual time.

`run_config(cfg, workload, costs, controller, out_dir)` is the one place that builds the
orchestrator for a simulated run: the unchanged `Orchestrator`, `SimDevice`s, a
`VirtualClock`, the `SimPromptSource` stand-in task, and a `RunDir` (in memory, or the same
run-directory files as a live run when `out_dir` is given). `sim.results_row.results_row`
turns a finished run into a `results` row of `dynaresize simulate --json`.

Faults and checkpoints are wired as `runner.run_training` wires them for Ray: the same
`FaultInjector` (`[[faults.kill]]`, killing through `SimProcesses`), `Recovery` (asking
`SimProcesses.is_alive`) and `Checkpointer` (every `run.checkpoint_every` steps; files in
`out_dir`, else a temporary directory). A run with neither builds none of them, as before.
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dynaresize.config import Config, KillEntry, to_toml, validate
from dynaresize.control.base import Controller
from dynaresize.core.rundir import RunDir
from dynaresize.orchestrator import Orchestrator
from dynaresize.orchestrator.checkpoint import CheckpointTarget
from dynaresize.orchestrator.fault_injection import FaultInjector
from dynaresize.sim.clock import VirtualClock
from dynaresize.sim.costs import CostModel
from dynaresize.sim.device import RolloutRecorder, make_devices
from dynaresize.sim.faults import SimProcesses
from dynaresize.sim.workloads import StepRequests, Workload


@dataclass(frozen=True)
class SimPrompt:
    id: int
    """The prompt's index within its step (the workload's `prompt`)."""
    tokens: tuple[int, ...]
    """Stand-in: `(num_prompt_tokens,)`; devices look up the true length."""
    step: int = -1


class SimPromptSource:
    """The orchestrator's task in the twin: stand-in prompts; reward 1 unless truncated.
    Dynamic sampling (`FilteredWorkload`): a group with a signal rewards its responses
    longer than its shortest 1, the others 0."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    def batch(self, step: int, num_prompts: int, seed: int) -> list[SimPrompt]:
        lengths = self.workload.step_requests(step).prompt_tokens
        return [SimPrompt(i, (int(lengths[i]),), step) for i in range(num_prompts)]

    def reward(self, prompt: Any, response_tokens: list[int]) -> float:
        if response_tokens[0] >= self.workload.max_response_tokens:
            return 0.0
        if getattr(self.workload, "max_rounds", 0) and \
                self.workload.group_has_signal(prompt.step, prompt.id):  # type: ignore
            group = self.workload.step_requests(prompt.step).response_tokens[prompt.id]
            return 1.0 if response_tokens[0] > int(group.min()) else 0.0
        return 1.0


class StepSubset(Workload):
    """`workload` seen through a step map: step i of this view is step `steps[i]`."""

    def __init__(self, workload: Workload, steps: list[int]) -> None:
        self._inner, self._steps = workload, steps
        self.name = workload.name
        self.prompts_per_step = workload.prompts_per_step
        self.samples_per_prompt = workload.samples_per_prompt
        self.max_response_tokens = workload.max_response_tokens
        self.num_steps = len(steps)
        self.max_rounds = getattr(workload, "max_rounds", 0)
        self.margin = getattr(workload, "margin", 1.0)
        self.episode_model = getattr(workload, "episode_model", None)

    def step_requests(self, step: int) -> StepRequests:
        return self._inner.step_requests(self._steps[step])

    def episodes(self, step: int) -> Any:
        """The episodes of an `EpisodeWorkload` (sim.episodes) at this view's step."""
        return self._inner.episodes(self._steps[step])  # type: ignore[attr-defined]

    def group_has_signal(self, step: int, prompt: int) -> bool:
        return self._inner.group_has_signal(self._steps[step], prompt)  # type: ignore


TWIN_MAX_TOKENS_PER_MICRO_BATCH = 16384
"""The twin's GPU deployments train token-budgeted micro-batches balanced over the ranks
(`train.balance`), as GPU trainers do (verl's per-GPU token budget defaults to 16,384); the
measured gain does not depend on the budget between 4k and 64k tokens (docs/simulator.md)."""


@dataclass(frozen=True)
class TwinFaults:
    """What `dynaresize simulate --config/--set` adds to a twin run: injected device deaths
    (`[[faults.kill]]`, as `dynaresize train` takes them) and checkpoints."""

    kill: tuple[KillEntry, ...] = ()
    checkpoint_every: int = 0
    hang_timeout_s: float | None = None
    """`faults.hang_timeout_s` (None: the config's default): a hang's watchdog bound."""

    def __bool__(self) -> bool:
        return bool(self.kill or self.checkpoint_every)


def sim_config(workload: Workload, num_rollout: int, num_train: int, steps: int,
               staleness: int, seed: int, costs: CostModel,
               faults: TwinFaults | None = None) -> Config:
    """The run configuration the twin hands the orchestrator (validated: a bad fault entry
    raises `ConfigError` naming it, e.g. `faults.kill[0].device`)."""
    cfg = Config()
    cfg.run.steps, cfg.run.staleness, cfg.run.seed = steps, staleness, seed
    cfg.task.prompts_per_step = workload.prompts_per_step
    cfg.task.samples_per_prompt = workload.samples_per_prompt
    cfg.task.max_new_tokens = workload.max_response_tokens
    cfg.rollout.max_running_requests = costs.max_running_requests
    cfg.rollout.slice_s = 30.0
    cfg.train.micro_batch_size = workload.samples_per_prompt
    cfg.train.max_tokens_per_micro_batch = TWIN_MAX_TOKENS_PER_MICRO_BATCH
    cfg.allocation.num_rollout_devices, cfg.allocation.num_train_devices = num_rollout, num_train
    cfg.devices.backend = "sim"
    cfg.controller.policy = "static"  # the split as given; run_policy sets another
    if getattr(workload, "max_rounds", 0):  # FilteredWorkload: dynamic sampling
        cfg.train.dynamic_sampling.enabled = True
        cfg.train.dynamic_sampling.max_rounds = workload.max_rounds  # type: ignore
        cfg.train.dynamic_sampling.margin = workload.margin  # type: ignore
    if faults:
        cfg.faults.kill = [replace(e) for e in faults.kill]
        cfg.run.checkpoint_every = faults.checkpoint_every
        if faults.hang_timeout_s is not None:
            cfg.faults.hang_timeout_s = faults.hang_timeout_s
    validate(cfg, check_machine=False)
    return cfg


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC during a run: a step allocates ~10^5 short-lived objects, and
    generation-2 collections otherwise take half the wall time. Collected once after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()


@dataclass
class SimRun:
    """A finished simulated run: its summary.json content and its in-memory records."""

    summary: dict[str, Any]
    rundir: RunDir
    orchestrator: Orchestrator | None = None


class SimWeightIO:
    """Checkpoint weight files of the twin: a handle is the version number it stands for."""

    @staticmethod
    def save(handle: Any, path: Path) -> None:
        path.write_text(f"{int(handle)}\n")

    @staticmethod
    def load(path: Path) -> Any:
        return int(path.read_text())


class InlineExecutor(ThreadPoolExecutor):
    """Runs `to_thread` work at once in the loop's thread: a thread would finish at an
    arbitrary virtual time (or look like a deadlock to the virtual clock). The twin's blocking
    work is small file I/O; it takes no virtual time."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


async def _inline_io(run: Coroutine[Any, Any, Any]) -> Any:
    asyncio.get_running_loop().set_default_executor(InlineExecutor(max_workers=1))
    return await run


def run_config(cfg: Config, workload: Workload, costs: CostModel,
               controller: Controller | None = None,
               out_dir: str | Path | None = None,
               recorder: RolloutRecorder | None = None,
               chaos: Callable[[list[Any], SimProcesses], None] | None = None) -> SimRun:
    """Run `cfg` (allocation, schedule, steps, staleness, faults, checkpoints) on SimDevices
    charged by `costs`, lengths from `workload`; `controller` overrides
    `cfg.controller.policy`. Writes config.toml, metrics/events/samples.jsonl and
    summary.json to `out_dir` if given. `recorder` sees every request and completion of the
    devices (`sim.device.RolloutRecorder`). `chaos(devices, processes)`: recovery on, and the
    caller installs its own device deaths (`sim.chaos`) before the run starts."""
    clock = VirtualClock()
    processes = SimProcesses()
    devices = make_devices(cfg.num_devices, cfg.allocation.num_rollout_devices, costs,
                           workload, clock, processes, recorder)
    if chaos is not None:
        chaos(devices, processes)
    rundir = RunDir(out_dir)
    rundir.write_config(to_toml(cfg))
    with ExitStack() as stack:
        checkpoints = None
        if cfg.run.checkpoint_every:
            ckpt_dir = rundir.path or stack.enter_context(tempfile.TemporaryDirectory(
                prefix="dynaresize-twin-"))
            checkpoints = CheckpointTarget(ckpt_dir, cfg.run.checkpoint_every, SimWeightIO())
        # What `runner.run_training` does for Ray devices, with the twin's process table.
        recover = bool(cfg.faults.kill) or checkpoints is not None or chaos is not None
        hang_s = cfg.faults.hang_timeout_s
        injector = FaultInjector(cfg.faults.kill, processes.kill, clock.now,
                                 lambda i: processes.hang(i, hang_s)) if recover else None

        try:
            orch = Orchestrator(cfg, devices, clock, SimPromptSource(workload), rundir,
                                controller=controller, checkpoints=checkpoints,
                                fail_op=injector.resize_hook(lambda: orch.state.step)
                                if injector is not None and cfg.faults.kill else None,
                                faults=processes if recover else None,
                                injector=injector if cfg.faults.kill else None)
            with no_gc():
                summary = clock.run(_inline_io(orch.run()) if checkpoints else orch.run())
            faults = injector.summary(orch.recovery.records, with_pending=True) \
                if injector is not None else {}
            if faults:
                summary.update(faults)
                rundir.summary(summary)
        finally:
            rundir.close()
    return SimRun(summary, rundir, orch)


def workload_for_config(cfg: Config, name: str = "balanced") -> Workload:
    """A synthetic workload shaped like `cfg`'s task (prompts x samples per step, lengths
    capped at `task.max_new_tokens`), seeded by `run.seed`: for simulating a live config."""
    from dynaresize.sim.workloads import get_workload

    wl = get_workload(name, seed=cfg.run.seed, prompts_per_step=cfg.task.prompts_per_step,
                      samples_per_prompt=cfg.task.samples_per_prompt)
    return replace(wl, max_response_tokens=cfg.task.max_new_tokens)
