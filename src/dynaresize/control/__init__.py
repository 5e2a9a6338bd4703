"""Controllers (pure, over a `RunView`): the registry, static/schedule, fixed, borrow and
hysteresis."""
