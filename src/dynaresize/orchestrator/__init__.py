"""The orchestrator as components (see `orchestrator.orchestrator` for the loop diagram)."""

from dynaresize.orchestrator.orchestrator import Orchestrator
from dynaresize.orchestrator.source import PromptLike, PromptSource
from dynaresize.orchestrator.state import RunState, VersionStore

__all__ = ["Orchestrator", "PromptLike", "PromptSource", "RunState", "VersionStore"]
