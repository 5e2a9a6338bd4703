"""`bench/speculative_vllm.py --warm-prompts N`: which prompts warm the engines; and the
requests the vLLM benches serve, seeded as a run's (`request_specs`; pure: no engine).

The timed requests are step 0's first P prompts (ids 0 .. P-1). The warm-up takes N prompts
of a later step's batch whose ids all come after them (`tasks.base.global_index`: prompt i of
step k has id k * N + i), so no timed prompt is ever served before it is timed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

WARM_REQUEST_STEP = -2
"""The step the warm-up's requests carry (the kernels' warm-up uses -1, the timed ones >= 0),
so their keys and sampling seeds never meet the timed ones'."""


def warm_step(num_timed: int, num_warm: int) -> int:
    """The first step whose batch of `num_warm` prompts has ids (step * num_warm ..) that all
    come after the `num_timed` timed ones (ids 0 .. num_timed - 1)."""
    if num_timed < 0 or num_warm <= 0:
        raise ValueError(f"num_timed = {num_timed}, num_warm = {num_warm}: need >= 0 and > 0")
    return max(1, -(-num_timed // num_warm))


def warm_prompts(task: Any, num_timed: int, num_warm: int, seed: int) -> list[Any]:
    """`num_warm` prompts of `task`, none of the `num_timed` timed ones ([] for 0)."""
    if not num_warm:
        return []
    prompts = task.batch(warm_step(num_timed, num_warm), num_warm, seed)
    if any(p.id < num_timed for p in prompts):  # a task numbering its prompts otherwise
        raise ValueError(f"warm-up prompt ids {[p.id for p in prompts]} meet the timed ones "
                         f"(0 .. {num_timed - 1})")
    return prompts


def request_specs(step: int, prompts: list[Any], samples: Iterable[int], max_new_tokens: int,
                  temperature: float, run_seed: int) -> list[Any]:
    """The requests of `samples` of each prompt at `step`, seeded as a run's would be
    (`core.types.request_seed`): the same sample draws the same tokens in every bench."""
    from dynaresize.core.types import RequestSpec, request_seed

    return [RequestSpec(step, p.id, s, 0, p.tokens, max_new_tokens,
                        request_seed(run_seed, step, p.id, s), temperature)
            for p in prompts for s in samples]
