"""TOML literals of values, for messages that echo what the user wrote (`true`, not `True`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def toml_repr(value: Any) -> str:
    """`value` as a TOML literal, as the user would write it: `true`, `'text'` (a literal
    string; a basic "..." string when it holds a quote or a control character), `[1, 2]`,
    `{a = 1}`, `nan`, `inf`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if "'" not in value and value.isprintable():
            return f"'{value}'"
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        escaped = "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in escaped)
        return f'"{escaped}"'
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_repr(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_repr(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return toml_repr(dataclasses.asdict(value))
    return repr(value)
