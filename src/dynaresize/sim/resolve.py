"""`resolve_workload`: what `simulate --workload` accepts, a preset name or a `.jsonl` trace.

Apart from `sim.workloads` because the `agentic-turns` preset is built by `sim.episodes`,
which itself builds on `sim.workloads`.
"""

from __future__ import annotations

from typing import Any

from dynaresize.sim.episodes import episode_workload
from dynaresize.sim.traces import load_trace
from dynaresize.sim.workloads import Workload, get_workload


def resolve_workload(spec: str, **kwargs: Any) -> Workload:
    """A preset name (`agentic-turns`: multi-turn episodes, `sim.episodes`) or a path to a
    `.jsonl` trace."""
    if spec.endswith(".jsonl") or "/" in spec:
        return load_trace(spec)
    if spec == "agentic-turns":
        return episode_workload(spec, **kwargs)
    return get_workload(spec, **kwargs)
