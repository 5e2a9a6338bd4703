"""The field checks every validation module uses (pure): each raises `ConfigError` naming the
field, the value and what is allowed."""

from __future__ import annotations

from dynaresize.config.schema import ConfigError


def positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(name, value, "must be > 0")


def non_negative(name: str, value: float) -> None:
    if value < 0:
        raise ConfigError(name, value, "must be >= 0")


def fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(name, value, "must be in [0, 1]")


def one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(name, value, f"allowed: {', '.join(allowed)}")
