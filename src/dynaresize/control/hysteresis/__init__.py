"""The `hysteresis` policy: a stage model, a split choice and staleness-0 lending, composed."""

from dynaresize.control.hysteresis.controller import HysteresisController
from dynaresize.control.hysteresis.model import HysteresisParams

__all__ = ["HysteresisController", "HysteresisParams"]
