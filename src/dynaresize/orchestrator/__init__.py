"""The orchestrator (see `orchestrator.orchestrator` for the loop diagram)."""

from dynaresize.orchestrator.orchestrator import (
                                                  Orchestrator,
                                                  PromptLike,
                                                  PromptSource,
                                                  VersionStore,
)

__all__ = ["Orchestrator", "PromptLike", "PromptSource", "VersionStore"]
