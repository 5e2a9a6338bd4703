"""The controller registry: every `controller.policy` name and how its controller is built.

One explicit table (no registration by import side effect): each controller class builds
itself from the run config with `build(cfg)`, reading its own nested table
(`[controller.hysteresis]`, `[controller.borrow]`). The CLI checks the name against this table
before any device starts; `dynaresize simulate` lists the same names next to its own
baselines (`colocated`, `reference`, `oracle`). Tests may add entries for the length of a test.
"""

from __future__ import annotations

from collections.abc import Callable

from dynaresize.config import Config, ConfigError
from dynaresize.control.base import Controller, ScheduleController
from dynaresize.control.borrow import BorrowController
from dynaresize.control.fixed import FixedSplit
from dynaresize.control.hysteresis.controller import HysteresisController

POLICIES: dict[str, Callable[[Config], Controller]] = {
    "hysteresis": HysteresisController.build,
    "static": ScheduleController.build,
    "fixed": FixedSplit.build,
    "borrow": BorrowController.build,
}
"""Policy name -> builder. `hysteresis` is the product; `static` and `fixed` never resize on
their own (`fixed` streams training and pipelines rollouts); `borrow` is a baseline."""


def check_policy(cfg: Config) -> None:
    """Raise ConfigError unless `controller.policy` names a registered policy."""
    if cfg.controller.policy not in POLICIES:
        raise ConfigError("controller.policy", cfg.controller.policy,
                          f"allowed: {', '.join(POLICIES)}")


def make_controller(cfg: Config) -> Controller:
    """The controller of `cfg.controller.policy`; a non-empty `[[resize.schedule]]` forces its
    resizes and nothing else (the `static` policy with that schedule), whatever the policy."""
    if cfg.resize.schedule:
        return ScheduleController.build(cfg)
    check_policy(cfg)
    return POLICIES[cfg.controller.policy](cfg)
