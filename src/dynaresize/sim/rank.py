"""SimRank: the training-rank state one simulated device holds, and the checks the live
trainer makes on it, as plain transitions (`SimDevice` charges the virtual time around each).

A rank knows its training group (sorted members), how many optimizer steps its state holds
(None: not a trainer), the layout a reshard prepared and not yet committed, and the step whose
streamed gradients it holds. An op on the wrong state fails loudly, as the live trainer does
(`FSDPTrainer._check_rounds`, the exact reducer's combine), so a recovery or resize that loses
or double-applies an update fails instead of passing.
"""

from __future__ import annotations

from dynaresize.sim.device_types import sorted_members

__all__ = ["SimRank"]


class SimRank:
    """One simulated device's training state (pure: no time, no I/O)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.members: tuple[int, ...] = ()
        """The training group this device is a rank of (sorted; empty if none)."""
        self.steps: int | None = None
        """Optimizer steps the training state of this rank holds (None: not a trainer)."""
        self._groups: set[frozenset[int]] = set()
        """Member sets this device has a communicator for (frozensets cache their hash)."""
        self._next_steps: int | None = None
        """The steps a prepared reshard hands this device (None: not a member of it)."""
        self._held_step: int | None = None
        """The step whose streamed gradients this rank holds (`hold`)."""
        self._dropped_step: int | None = None
        """A step whose held gradients a world rebuild dropped (its finish fails, as live)."""

    def expect(self, num_steps: int, op: str) -> None:
        """`op` needs the training state after `num_steps` optimizer steps: RuntimeError
        otherwise (an update was lost or applied twice)."""
        if self.steps != num_steps:
            raise RuntimeError(f"simulated device {self.index}: {op} needs the training state "
                               f"after {num_steps} optimizer steps; this rank holds "
                               f"{self.steps} (an update was lost or applied twice)")

    def cache_group(self, members: tuple[int, ...]) -> bool:
        """Remember a communicator for `members`; True if it is new to this device."""
        member_set = sorted_members(members)[1]
        created = member_set not in self._groups
        self._groups.add(member_set)
        return created

    # ------------------------------------------------------------------ resize (design §4)
    def prepare(self, new_members: tuple[int, ...], optimizer_step: int) -> None:
        """A reshard to `new_members`: an old member sends the state after `optimizer_step`
        steps; a new member will hold it once the layout commits."""
        if self.steps is not None and self.members:
            self.expect(optimizer_step, "reshard")
        member = self.index in sorted_members(new_members)[1]
        self._next_steps = optimizer_step if member else None

    def commit(self, new_members: tuple[int, ...]) -> bool:
        """Switch to the prepared layout; True if this device trains in it."""
        key, member_set = sorted_members(new_members)
        member = self.index in member_set
        if member:
            self.members = key
            if self._next_steps is not None:
                self.steps = self._next_steps
        else:
            self.members, self.steps = (), None
        self._next_steps = None
        return member

    def abort(self) -> None:
        """Discard the prepared layout; the old one stays in charge."""
        self._next_steps = None

    def join(self, members: tuple[int, ...]) -> tuple[bool, bool]:
        """Join the training group `members`: (this device is a member, its communicator was
        cached). A new trainer starts from the version-0 model with fresh AdamW state."""
        key, member_set = sorted_members(members)
        if self.index not in member_set:
            return False, False
        cached = member_set in self._groups
        self._groups.add(member_set)
        self.members = key
        if self.steps is None:
            self.steps = 0
        return True, cached

    # ------------------------------------------------------------------ training steps
    def start_step(self, step: int) -> None:
        """A whole train step of `step` may start: right state, no gradients held."""
        self.expect(step, "train_step")
        if self._held_step is not None:  # as the live trainer (`FSDPTrainer._check_rounds`)
            raise ValueError(f"simulated device {self.index}: train_step of step {step} while "
                             f"gradients of step {self._held_step} are held")

    def hold(self, step: int) -> None:
        """Streamed micro-batches of `step` accumulate into held gradients."""
        self._held_step = step

    def start_finish(self, step: int) -> None:
        """The held gradients of `step` combine: right state, not dropped by a rebuild."""
        self.expect(step, "train_finish")
        if self._dropped_step == step:  # as the live trainer's combine: held by no rank
            raise ValueError(f"simulated device {self.index}: finish of step {step}: its "
                             "held gradients were dropped by a world rebuild")
        self._held_step = None

    def stepped(self, step: int) -> None:
        """The optimizer applied `step`."""
        self.steps = step + 1

    def restored(self, optimizer_step: int) -> None:
        """A checkpoint after `optimizer_step` steps was loaded into this rank."""
        self.steps = optimizer_step

    # ------------------------------------------------------------------ recovery
    def rebuild(self, members: tuple[int, ...], optimizer_step: int,
                keep_train_state: bool) -> bool:
        """A new world: every cached communicator is gone, held gradients are dropped. True
        if this device trains in it (keeping its state, or from step 0's)."""
        key, member_set = sorted_members(tuple(members))
        self._groups = {member_set}
        self._next_steps = None
        self._dropped_step, self._held_step = self._held_step, None  # a new trainer
        if self.index not in member_set:
            self.members, self.steps = (), None
            return False
        if keep_train_state:
            self.expect(optimizer_step, "rebuild_world(keep_train_state)")
            if self.members != key:  # live: the kept shards are rows of the old layout
                raise RuntimeError(f"simulated device {self.index}: rebuild_world keeps the "
                                   f"shards of group {self.members} for group {key} (a "
                                   "layout the state was not sharded for)")
        self.members = key
        self.steps = optimizer_step if keep_train_state else 0
        return True
