"""HeldRun: a `RolloutRun` that stays open while a step's episodes have turns to come.

A multi-turn episode (envs) is a chain of ordinary requests: turn t + 1 is submitted only once
turn t finished and the environment answered it. A plain run ends when its last request
completes; between two turns of the last episodes no request is left, yet the step is not
over. A `HeldRun` counts the episodes still open (`num_open`): it finishes once no request is
left *and* every episode closed (`close_episode`), or at once on an error (`fail`).

* `submit(specs)`: the next turns' requests join the run's queue (dispatch as usual: any
  engine; migration and reruns after a device death work as for any request, since a turn's
  tokens depend on its prompt, the episode context, and its seed only).
* Completions are handed to `on_completions` as they come (no batching at
  `PROGRESS_FRACTION`): a finished turn is what its episode waits for.
* `slices`: every `run_rollout` call's (start, end) clock seconds, the engines' busy time, so
  the time engines worked while environments were answering can be measured
  (`envs.serve.overlap_s`).

Tail ordering (`RunSettings.tail_order`) assumes the request set is known at the start; the
episode rollout builds its HeldRun without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dynaresize.core.types import Completion, RequestSpec
from dynaresize.protocols import Clock, RolloutOps
from dynaresize.rollout.run import RolloutRun
from dynaresize.rollout.run_settings import RunSettings
from dynaresize.rollout.slots import Work


class HeldRun(RolloutRun):
    def __init__(self, clock: Clock, requests: Sequence[Work], settings: RunSettings,
                 on_completions: Callable[[list[Completion]], None], num_episodes: int,
                 on_device_lost: Callable[[RolloutOps, BaseException], bool] | None = None
                 ) -> None:
        if settings.tail_order:
            raise ValueError("HeldRun: tail ordering needs the whole request set at the start")
        self.num_open = num_episodes
        """Episodes not yet closed (each holds the run open)."""
        self.slices: list[tuple[float, float]] = []
        super().__init__(clock, requests, settings, on_completions, on_device_lost)

    def submit(self, specs: Sequence[RequestSpec]) -> None:
        """Next turns' requests: queued behind the others, dispatched at once."""
        if self.finished.is_set():
            raise RuntimeError("HeldRun: a request submitted after the run finished")
        self.add_requests(specs)

    def close_episode(self) -> None:
        """An episode ended (its environment gave the reward): it holds the run no longer."""
        if self.num_open <= 0:
            raise RuntimeError("HeldRun: more episodes closed than were open")
        self.num_open -= 1
        self._set_finished()

    def fail(self, exc: BaseException) -> None:
        """An episode failed (its environment raised): the run ends with that error."""
        if self.error is None:
            self.error = exc
        self._set_finished()

    def _set_finished(self) -> None:
        if self.error is None and (self.num_open > 0 or self.progress.remaining > 0):
            return  # an episode still has a turn to come
        super()._set_finished()

    def _report(self, completions: list[Completion]) -> None:
        if completions:
            self.on_completions(list(completions))

    def _sliced(self, start_s: float, end_s: float) -> None:
        self.slices.append((start_s, end_s))
