"""The `borrow` baseline: training devices lent to rollout while they idle (trainer→rollout
only), in the spirit of verl's dynamic_schedule for one-step-off training.

We could not retrieve verl's dynamic_schedule documentation from here, so its thresholds are
our assumptions, each a field of `BorrowConfig` (documented in docs/simulator.md):

- *When to lend*: during a step's rollout, once the training pool is idle (every earlier step
  is trained: with staleness 1 the previous step's training has finished), and at least
  `min_remaining_fraction` of the step's requests are still unfinished.
- *Switch-cost window*: only if the expected remaining rollout time is at least
  `window_factor` x the cost of a lend-and-return pair (two resizes' critical paths, measured
  from the run's own resizes; `prior_switch_s` per resize until one was measured). The
  remaining time is extrapolated from the step so far, or from the previous step's rollout.
- *How many*: `borrow_fraction` of the training pool (rounded down, at least 1), never the
  last `min_train_devices`.
- *When to return*: when `return_fraction` of the step's requests have finished (the tail,
  where the extra engines would idle anyway), or at the end of the rollout at the latest, so
  the next optimizer step runs on the full training pool. Never rollout→train beyond that.

Pure decision logic over `RunView` (no devices, clocks or I/O): it runs live and simulated.
"""

from __future__ import annotations

from dynaresize.config import BorrowConfig, Config
from dynaresize.control.base import Controller, Move, RunView


class BorrowController(Controller):
    """Lends trainers to rollout inside a step and takes them back before training."""

    def __init__(self, cfg: BorrowConfig | None = None) -> None:
        self.cfg = cfg or BorrowConfig()
        self._lent = 0
        self._lent_step = -1
        self._step = -1
        self._closed_step = -1
        """The step in which `on_rollout_progress` can return nothing more."""

    @classmethod
    def build(cls, cfg: Config) -> BorrowController:
        """`controller.policy = "borrow"`, parameters from `[controller.borrow]`."""
        return cls(cfg.controller.borrow)

    @property
    def needs_progress(self) -> bool:
        """False once this step's lend-and-return is over or too late to start (the share
        of finished requests only grows): the orchestrator then stops reporting progress, so
        rollout devices may run until empty. The decisions are the same either way."""
        return self._closed_step != self._step

    def at_step_start(self, view: RunView) -> list[Move]:
        self._step = view.step
        return self._return()

    def _return(self) -> list[Move]:
        if not self._lent:
            return []
        num, self._lent = self._lent, 0
        return [Move("rollout->train", num)]

    def _switch_s(self, view: RunView) -> float:
        measured = view.resize_critical_s[-4:]
        per_resize_s = sum(measured) / len(measured) if measured else self.cfg.prior_switch_s
        return 2.0 * per_resize_s

    def _remaining_rollout_s(self, view: RunView) -> float:
        done = view.rollout_finished / view.rollout_total
        elapsed_s = view.now_s - view.rollout_started_s
        if done > 0.05:
            return elapsed_s * (1.0 - done) / done
        if view.history:
            return max(0.0, view.history[-1].rollout_s - elapsed_s)
        return 0.0

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        self._step = view.step
        if not view.rollout_total:
            return []
        done = view.rollout_finished / view.rollout_total
        if self._lent:
            if done < self.cfg.return_fraction:
                return []
            self._closed_step = view.step
            return self._return()
        if self._lent_step == view.step or 1.0 - done < self.cfg.min_remaining_fraction:
            self._closed_step = view.step  # lent and returned, or too late to lend
            return []
        trainers_idle = len(view.history) >= view.step
        if not trainers_idle:
            return []
        num_train = len(view.allocation.train)
        num = min(num_train - self.cfg.min_train_devices,
                  max(1, int(num_train * self.cfg.borrow_fraction)))
        if num < 1 or self._remaining_rollout_s(view) < self.cfg.window_factor \
                * self._switch_s(view):
            return []
        self._lent, self._lent_step = num, view.step
        return [Move("train->rollout", num)]

    def at_rollout_end(self, view: RunView) -> list[Move]:
        return self._return()
