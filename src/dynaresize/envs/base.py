"""The environment protocol for multi-turn episodes (issue 26).

An *episode* is sample `sample` of prompt `prompt` in step `step`: the model writes a turn,
the environment answers it with text (a tool result, feedback, a game state) or ends the
episode with a reward; at most `max_turns` model turns.

The environment is a function of the episode's history, not an object that mutates between
calls: `step(ctx)` sees the prompt, the episode seed, the turn index and every earlier model
text and environment answer (`TurnContext`). That is what makes the contract of design §2 hold
for episodes and the "never stepped twice" rule checkable:

* the episode seed (`episode_seed`) comes from (run seed, step, prompt, sample) only, and the
  environment draws its randomness for turn `t` from `turn_rng(ctx)` = f(episode seed, t), so
  a replayed turn gives the same answer whatever engine, allocation or resize came before;
* each model turn samples with `turn_seed(run seed, step, prompt, sample, turn)`; turn 0 uses
  `request_seed` itself, so a one-turn episode is exactly today's single-turn sample;
* an `EpisodeLog` (envs.log) keeps every answered turn; a recovered episode resumes from it and
  the environment is asked only about turns the log does not hold.

An environment may take wall time in `step` (a tool that calls a process, a sleeping tool);
the driver (envs.driver) awaits it off the engine.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from dynaresize.core.types import request_seed
from dynaresize.tasks.base import Prompt

ROLES = ("tool", "user")
"""Who speaks an observation in the chat template: a tool result or the environment as user."""


def episode_seed(run_seed: int, step: int, prompt: int, sample: int) -> int:
    """Seed of an episode's environment randomness: a function of (run seed, step, prompt,
    sample) only, distinct from the sampler seed of any of its turns."""
    packed = struct.pack("<4q", run_seed, step, prompt, sample)
    digest = hashlib.sha256(b"dynaresize.env" + packed).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def turn_seed(run_seed: int, step: int, prompt: int, sample: int, turn: int) -> int:
    """Sampler seed of model turn `turn` of an episode (turn 0: the single-turn request seed)."""
    if turn < 0:
        raise ValueError(f"turn = {turn}: must be >= 0")
    if turn == 0:
        return request_seed(run_seed, step, prompt, sample)
    packed = struct.pack("<5q", run_seed, step, prompt, sample, turn)
    digest = hashlib.sha256(b"dynaresize.turn" + packed).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def text_sha256(text: str) -> str:
    """Hash of a model turn's text: how a log recognises the action a turn was answered for."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Feedback:
    """The environment's answer to one model turn."""

    text: str = ""
    """What the model sees next (ignored when `done`)."""
    done: bool = False
    reward: float = 0.0
    """The episode's reward in [0, 1]; read only when `done`."""
    role: str = "tool"
    """Chat role of `text`: one of `ROLES`."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """JSON-able details for the record (tool name, parse error, score of this attempt)."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"feedback role = {self.role!r}: allowed: {', '.join(ROLES)}")
        if self.done and not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"feedback reward = {self.reward}: must be in [0, 1]")


@dataclass(frozen=True)
class TurnContext:
    """Everything an environment may look at when it answers model turn `turn`."""

    prompt: Prompt
    seed: int
    """The episode seed (`episode_seed`)."""
    turn: int
    """0-based index of the model turn being answered."""
    max_turns: int
    texts: tuple[str, ...]
    """Decoded model turns 0..turn (the last one is the turn being answered)."""
    answers: tuple[Feedback, ...]
    """The environment's answers to turns 0..turn-1."""

    @property
    def text(self) -> str:
        """The model turn being answered."""
        return self.texts[-1]

    @property
    def last_turn(self) -> bool:
        """Whether this is the last turn the episode may have (the answer must end it)."""
        return self.turn + 1 >= self.max_turns


def turn_rng(ctx: TurnContext) -> random.Random:
    """The environment's random stream for turn `ctx.turn`: f(episode seed, turn) only."""
    digest = hashlib.sha256(struct.pack("<2q", ctx.seed, ctx.turn)).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment: answers each model turn, or ends the episode with a reward.

    `step` must be a function of `ctx` (and of `turn_rng(ctx)` for randomness): no state kept
    between calls that is not in `ctx`, so a replayed turn gets the same answer. It must end
    the episode (`done=True`) when `ctx.last_turn`; the driver enforces it.
    """

    name: str
    max_turns: int

    async def step(self, ctx: TurnContext) -> Feedback:
        ...


def check_max_turns(max_turns: int) -> int:
    """`max_turns` if it is a valid bound (>= 1), else ValueError naming it."""
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns = {max_turns!r}: must be an integer >= 1")
    return max_turns
