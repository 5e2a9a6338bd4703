"""EngineTransit: the rollout engines in transit, each set with this one owner.

An engine in transit is in no run, or in a run it is leaving, and no other path may take it
meanwhile. Who moves it says why, and each kind has its own set here:

- `arriving()`: on their way from a tail (or free) to the newest run, loading its version
  (the engine pool's `join_newest`); a tail rescue in progress counts as one (a negative
  token: no resize until it is rescued, `start_rescue`);
- `loading`: a new step's first engines while they load its version (`loading_for_step`);
- borrowed: on their way to a run by a side path, a tail rescue's donor or an engine that
  serves again after a repair (`borrowing`);
- `leaving`: rollout → train devices a resize stopped (`leave`), until it ends;
- `serving_early`: train → rollout devices serving before their resize commits (`serve`).

The engine pool, its resize hooks and the tail rescue change these sets only through the
methods below; the read-only views they return are the sets themselves (no copy).
"""

from __future__ import annotations

from collections.abc import Iterator, Set
from contextlib import contextmanager


class EngineTransit:
    def __init__(self) -> None:
        self._arriving: set[int] = set()
        """Devices on their way from a tail (or free) to the newest run, and the tokens
        (negative) of tail rescues in progress."""
        self._num_rescues = 0
        """Tokens in `_arriving`."""
        self._loading: set[int] = set()
        self._borrowed: set[int] = set()
        self._leaving: set[int] = set()
        self._serving_early: set[int] = set()

    # ------------------------------------------------------------------ to the newest run
    def add_arriving(self, index: int) -> None:
        """Device `index` left a tail (or was free) for the newest run."""
        self._arriving.add(index)

    def arrived(self, index: int) -> None:
        """Device `index` joined the newest run, or stays out of it."""
        self._arriving.discard(index)

    def start_rescue(self, lost_index: int) -> int:
        """A tail rescue for the engine `lost_index` starts; returns its token."""
        token = -1 - lost_index
        self._arriving.add(token)
        self._num_rescues += 1
        return token

    def end_rescue(self, token: int) -> None:
        self._arriving.discard(token)
        self._num_rescues -= 1

    def has_arriving(self) -> bool:
        """Whether a device or a tail rescue is on its way to the newest run."""
        return bool(self._arriving)

    def arriving(self) -> set[int]:
        """Devices on their way to the newest run (`run_settings.Arrivals`; read it only)."""
        if not self._num_rescues:  # the set itself: no copy per join
            return self._arriving
        return {i for i in self._arriving if i >= 0}

    def in_transit(self) -> set[int]:
        """A new set: the devices (and rescue tokens) on their way to the newest run, and
        the borrowed ones."""
        return self._arriving | self._borrowed

    # ------------------------------------------------------------------ a new step's first engines
    @property
    def loading(self) -> Set[int]:
        return self._loading

    @contextmanager
    def loading_for_step(self, indices: set[int]) -> Iterator[None]:
        """`indices` load a new step's version meanwhile."""
        self._loading |= indices
        try:
            yield
        finally:
            self._loading -= indices

    # ------------------------------------------------------------------ side paths
    @contextmanager
    def borrowing(self, index: int) -> Iterator[None]:
        """Device `index` is on its way to a run by a side path meanwhile."""
        self._borrowed.add(index)
        try:
            yield
        finally:
            self._borrowed.discard(index)

    # ------------------------------------------------------------------ resizes
    @property
    def leaving(self) -> Set[int]:
        return self._leaving

    @property
    def serving_early(self) -> Set[int]:
        return self._serving_early

    def leave(self, index: int) -> None:
        """A resize stopped rollout device `index`: no new rollout work."""
        self._leaving.add(index)

    def serve(self, index: int, early: bool) -> None:
        """Device `index` joins the rollout (`early`: a training device until its resize
        commits)."""
        self._leaving.discard(index)
        if early:
            self._serving_early.add(index)

    def forget(self, moved: Set[int]) -> None:
        """A resize ended: the devices it moved are in their pools."""
        self._serving_early -= moved
        self._leaving -= moved
