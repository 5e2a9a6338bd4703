"""The episode log: what makes "never stepped twice for the same turn" checkable.

The log holds, per episode, every finished model turn (`TurnRecord`) and every environment
answer with the hash of the model text it answered. `answer(env, ctx)` is the only way the
driver asks an environment:

* a turn the log has answered is answered from the log (the environment is not called), after
  checking that the model text is the one it answered (same hash; else the replay diverged,
  which the contract of design §2 forbids, and it raises);
* the next unanswered turn calls the environment once and logs the answer;
* a turn beyond that (a gap) raises.

`env_calls[turn]` counts the environment calls per turn: at most 1 for every turn of every
episode, whatever migrations and recoveries happened, is the rule. The log is plain data
(`to_dict` / `from_dict`, JSON-able), so a recovered orchestrator can resume an episode from
the copy it kept, without regenerating its turns or stepping its environment again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynaresize.envs.base import Environment, Feedback, TurnContext, text_sha256
from dynaresize.envs.episode import TurnRecord


class ReplayDiverged(RuntimeError):
    """A logged turn is asked again for a different model text."""


@dataclass(frozen=True)
class LoggedAnswer:
    turn: int
    text_sha256: str
    """Hash of the model text this answer was given for."""
    feedback: Feedback


@dataclass
class EpisodeLog:
    """The finished turns and environment answers of one episode (see module docstring)."""

    key: tuple[int, int, int]
    """(step, prompt, sample)."""
    turns: list[TurnRecord] = field(default_factory=list)
    answers: list[LoggedAnswer] = field(default_factory=list)
    env_calls: dict[int, int] = field(default_factory=dict)
    """Environment calls per turn index, counted by this log (not persisted: a fresh count
    per process; `to_dict` keeps the answers, which is what stops a second call)."""
    replayed: int = 0
    """Answers served from the log instead of the environment."""

    def add_turn(self, record: TurnRecord) -> None:
        """Log finished model turn `record.turn` (the next one, in order)."""
        if record.turn != len(self.turns):
            raise ValueError(f"episode {self.key}: turn {record.turn} logged after "
                             f"{len(self.turns)} turns (turns are logged in order)")
        self.turns.append(record)

    async def answer(self, env: Environment, ctx: TurnContext) -> Feedback:
        """The environment's answer to `ctx`: from the log if it holds it, else one call."""
        sha = text_sha256(ctx.text)
        if ctx.turn < len(self.answers):
            logged = self.answers[ctx.turn]
            if logged.text_sha256 != sha:
                raise ReplayDiverged(f"episode {self.key} turn {ctx.turn}: the model text "
                                     "differs from the one the environment answered")
            self.replayed += 1
            return logged.feedback
        if ctx.turn != len(self.answers):
            raise ValueError(f"episode {self.key}: turn {ctx.turn} asked before turn "
                             f"{len(self.answers)} was answered")
        self.env_calls[ctx.turn] = self.env_calls.get(ctx.turn, 0) + 1
        feedback = await env.step(ctx)
        self.answers.append(LoggedAnswer(ctx.turn, sha, feedback))
        return feedback

    @property
    def max_env_calls_per_turn(self) -> int:
        """The rule checked: 1 (or 0 for an episode not yet answered), never more."""
        return max(self.env_calls.values(), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"key": list(self.key), "turns": [t.to_dict() for t in self.turns],
                "answers": [{"turn": a.turn, "text_sha256": a.text_sha256,
                             "text": a.feedback.text, "done": a.feedback.done,
                             "reward": a.feedback.reward, "role": a.feedback.role,
                             "info": dict(a.feedback.info)} for a in self.answers]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeLog:
        step, prompt, sample = (int(x) for x in data["key"])
        answers = [LoggedAnswer(int(a["turn"]), str(a["text_sha256"]),
                                Feedback(text=a["text"], done=bool(a["done"]),
                                         reward=float(a["reward"]), role=a["role"],
                                         info=dict(a["info"])))
                   for a in data["answers"]]
        return cls(key=(step, prompt, sample),
                   turns=[TurnRecord.from_dict(t) for t in data["turns"]], answers=answers)
