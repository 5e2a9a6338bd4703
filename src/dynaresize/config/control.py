"""The config's control sections: `[controller]` (with `[controller.hysteresis]` and
`[controller.borrow]`), `[resize]` (forced `[[resize.schedule]]`) and `[faults]` (injected
`[[faults.kill]]`), every field documented (re-exported by `config.schema`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dynaresize.config.fields import doc_field as _doc


@dataclass
class HysteresisConfig:
    """`[controller.hysteresis]`: the `hysteresis` policy's parameters."""

    band: float = _doc("Change the split only if the predicted step time improves by more "
                       "than this fraction.", default=0.05)
    min_dwell_steps: int = _doc("Steps between two split changes, at least.", default=3)
    horizon_steps: int = _doc("Steps over which a resize must pay for itself.", default=4)
    cost_margin: float = _doc("Expected saving must exceed this x resize cost.", default=2.0)
    resize_guess_s: float = _doc("Staleness 0: seconds a resize is assumed to take, until one "
                                 "was measured, when weighing lending rollout engines to "
                                 "training.", default=5.0)
    release_tail: bool = _doc("Staleness 0: lend every rollout device but one to training at "
                              "the rollout's end when predicted to pay (they return at the "
                              "next step).", default=True)
    tail_batch: int = _doc("Requests per engine that count as lightly loaded in the rollout "
                           "tail.", default=8)
    lend_min_cv: float = _doc("Staleness 0: lend rollout engines to training only when the "
                              "response lengths have a tail: their measured coefficient of "
                              "variation (std / mean) is at least this (lending is two "
                              "resizes a step; short, even lengths keep one split).",
                              default=0.5)


@dataclass
class BorrowConfig:
    """`[controller.borrow]`: the `borrow` baseline's parameters (docs/simulator.md)."""

    min_remaining_fraction: float = _doc("Lend only while at least this share of the step's "
                                         "requests is unfinished.", default=0.5)
    return_fraction: float = _doc("Return the borrowed devices once this share of the "
                                  "requests has finished.", default=0.9)
    borrow_fraction: float = _doc("Share of the training pool lent.", default=0.5)
    min_train_devices: int = _doc("Never lend these last training devices.", default=1)
    window_factor: float = _doc("Remaining rollout must be at least this many times the lend "
                                "+ return cost.", default=2.0)
    prior_switch_s: float = _doc("Assumed critical path of one resize before any was "
                                 "measured, seconds.", default=5.0)


@dataclass
class ControllerConfig:
    policy: str = _doc("Allocation policy (dynaresize.control.registry): 'hysteresis' (balance the "
                       "stages at runtime: split between steps, tail release, streaming "
                       "training), 'static' (fixed split, plus any forced [[resize.schedule]]), "
                       "'fixed' (a fixed split with streaming training and pipelined "
                       "rollouts) or 'borrow' (trainer->rollout borrowing only, a baseline). A "
                       "non-empty [[resize.schedule]] forces its resizes instead.",
                       default="hysteresis")
    stream_training: bool = _doc("Streaming policies (hysteresis, fixed): train a step's "
                                 "micro-batches as their groups complete, while the rollout "
                                 "tail finishes (same update; needs train.exact_reduction).",
                                 default=True)
    pipeline_rollouts: bool = _doc("Streaming policies, staleness >= 1: start the next step's "
                                   "rollout on the engines the current step's tail has "
                                   "emptied (same samples). At staleness s >= 2 up to s + 1 "
                                   "steps roll out at once, a new step's first engines take "
                                   "up to twice their share of its requests, and a resize "
                                   "stops engines where they are instead of draining the "
                                   "pipeline (docs/architecture.md).", default=True)
    hysteresis: HysteresisConfig = field(default_factory=HysteresisConfig)
    borrow: BorrowConfig = field(default_factory=BorrowConfig)


MOVES = ("rollout->train", "train->rollout")


@dataclass
class ResizeEntry:
    """One forced resize: `[[resize.schedule]]`."""

    step: int = _doc("RL step (0-based) in which it happens.", default=0)
    at: str = _doc("'start' (before the step's rollout) or 'rollout:F' (F in (0,1): once that "
                   "fraction of the step's requests has finished).", default="start")
    move: str = _doc("'rollout->train' or 'train->rollout'.", default="rollout->train")
    num_devices: int = _doc("How many devices move.", default=1)

    @property
    def fraction(self) -> float:
        """0.0 for 'start', else F of 'rollout:F'."""
        return 0.0 if self.at == "start" else float(self.at.split(":", 1)[1])


@dataclass
class ResizeConfig:
    staging_bytes: int = _doc("Bound of the staging buffer that reshards training state, "
                              "bytes per device.", default=4 * 2**20)
    schedule: list[ResizeEntry] = _doc("Forced resizes ([[resize.schedule]] tables).",
                                       default_factory=list)


@dataclass
class KillEntry:
    """One injected fault: `[[faults.kill]]` kills a device's process for real."""

    device: int = _doc("Device index to kill.", default=0)
    step: int = _doc("RL step (0-based) in which it dies.", default=0)
    at: str = _doc("'rollout:F' (once that fraction of the step's requests finished), "
                   "'train' (during the step's training) or 'resize' (during a resize).",
                   default="train")
    how: str = _doc("'kill' (SIGKILL: the process is gone) or 'hang' (SIGSTOP: it freezes, "
                    "and faults.hang_timeout_s later the watchdog kills it).", default="kill")


@dataclass
class FaultsConfig:
    kill: list[KillEntry] = _doc("Injected device deaths ([[faults.kill]] tables).",
                                 default_factory=list)
    timeout_s: float = _doc("Process-group timeout: a collective waiting for a dead peer "
                            "fails after this long (gloo usually fails at once).", default=60.0)
    hang_timeout_s: float = _doc(
        "A device that answers no liveness ping this long is taken for hung and killed, so "
        "recovery goes on without it (0: never; else 1 to 0.75 x faults.timeout_s, so a "
        "frozen trainer is killed before its peers' collectives time out).", default=30.0)
