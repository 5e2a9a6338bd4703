"""The config's field helper: a dataclass field with its one-line meaning (`--dry-run` prints
it). No torch/Ray."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def doc_field(text: str, **kwargs: Any) -> Any:
    """A dataclass field whose metadata holds `text`, the key's meaning."""
    return field(metadata={"doc": text}, **kwargs)
