"""How a pipelined rollout run gives its engines to the next step: the decisions (pure).

Once the next step's run exists, a run hands off (`RolloutRun.hand_off`): each engine that has
nothing left of this step leaves for the next one (`may_release`; the last one stays until this
run ends, so requeued work always has an engine), and the thinning tail is packed: as soon as
the other engines would hold every remaining request at `pack_batch` each, the least-loaded
engine (`pack_candidate`) exports its requests (token prefix and sampler state, so they
continue unchanged elsewhere, design §2.3), they are requeued in front on the others, and the
engine leaves too. One engine is packed at a time. The run does the moving (its
export-and-requeue); this module only decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from dynaresize.rollout.slots import EngineSlot


def may_release(slot: EngineSlot, slots: Sequence[EngineSlot], queue_empty: bool,
                remaining: int) -> bool:
    """Whether `slot`'s engine, which holds nothing, may leave now: nothing is queued, and
    some other engine stays while requests remain."""
    if slot.leaving or not queue_empty:
        return False
    return not remaining or any(s is not slot and not s.leaving for s in slots)


def pack_candidate(slots: Sequence[EngineSlot], remaining: int, pack_batch: int
                   ) -> EngineSlot | None:
    """The engine to pack away now: the least-loaded (ties: highest index) if the other
    active engines hold every remaining request at `pack_batch` each; else None."""
    if (len(slots) - 1) * pack_batch < remaining:
        return None
    active = [s for s in slots if not s.leaving]
    if len(active) < 2 or (len(active) - 1) * pack_batch < remaining:
        return None
    return min(active, key=lambda s: (s.load, -s.index))
