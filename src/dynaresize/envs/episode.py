"""The episode data model: turns, observations, the token view the trainer consumes, the record.

An episode's token stream is

    prompt | turn 0 | obs 0 | turn 1 | obs 1 | ... | turn T-1

where `turn t` are the tokens model turn t sampled (EOS included if it stopped) and `obs t` the
environment's answer to it rendered as tokens (envs.render). Turn t's request prompt is that
stream up to `turn t` (`context_tokens`): the context is kept between turns, never re-rendered
from text, so the tokens the model was trained on are exactly those it sampled from.

`flatten` turns an episode into (response tokens, loss mask, behaviour log-probs) over
everything after the prompt: mask 1 on model tokens, 0 on observation tokens (their log-probs
are 0 placeholders). `episode_record` is the samples.jsonl record of design §2.5 for an
episode: one record per episode, each turn's token count, hash, version and device, and the
environment's observations. Timing (`gen_s`, `env_s`) is kept on the objects for calibration
but is not part of the record: records are a function of config and seed only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynaresize.core.types import tokens_sha256


@dataclass(frozen=True)
class TurnRecord:
    """One finished model turn."""

    turn: int
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    version: int
    device: int
    finish_reason: str
    """'eos' or 'length'."""
    seed: int
    """The turn's sampler seed (`envs.base.turn_seed`)."""
    context_tokens: int
    """Length of the turn's request prompt (the episode stream before it)."""
    gen_s: float = field(default=0.0, compare=False)
    """Clock seconds from submitting the turn to its completion (not part of the record)."""

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.logprobs):
            raise ValueError(f"turn {self.turn}: {len(self.tokens)} tokens but "
                             f"{len(self.logprobs)} log-probs")

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "tokens": list(self.tokens), "logprobs": list(self.logprobs),
                "version": self.version, "device": self.device,
                "finish_reason": self.finish_reason, "seed": self.seed,
                "context_tokens": self.context_tokens, "gen_s": self.gen_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TurnRecord:
        return cls(int(d["turn"]), tuple(int(t) for t in d["tokens"]),
                   tuple(float(x) for x in d["logprobs"]), int(d["version"]), int(d["device"]),
                   str(d["finish_reason"]), int(d["seed"]), int(d["context_tokens"]),
                   float(d.get("gen_s", 0.0)))


@dataclass(frozen=True)
class Observation:
    """The environment's answer to model turn `turn`, as text and as context tokens."""

    turn: int
    text: str
    role: str
    tokens: tuple[int, ...]
    """What is appended to the context after turn `turn` (template markup included)."""
    env_s: float = field(default=0.0, compare=False)
    """Clock seconds the environment took (not part of the record)."""


@dataclass
class Episode:
    """One episode: sample `sample` of prompt `prompt` in step `step`."""

    step: int
    prompt: int
    sample: int
    version: int
    prompt_tokens: tuple[int, ...]
    turns: list[TurnRecord] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    """One per turn the environment did not end the episode on (so len(turns) - 1 when done)."""
    reward: float | None = None
    """Set when the environment ends the episode."""
    end_info: dict[str, Any] = field(default_factory=dict)
    """The final answer's `Feedback.info`."""
    env_waits: list[tuple[float, float]] = field(default_factory=list, compare=False)
    """(start, end) clock seconds of each environment answer, the final one included."""

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.step, self.prompt, self.sample)

    @property
    def done(self) -> bool:
        return self.reward is not None


def context_tokens(prompt_tokens: tuple[int, ...] | list[int], turns: list[TurnRecord],
                   observations: list[Observation]) -> tuple[int, ...]:
    """The episode stream so far: prompt, then each turn followed by its observation."""
    if not len(turns) - 1 <= len(observations) <= len(turns):
        raise ValueError(f"{len(turns)} turns and {len(observations)} observations: each "
                         "turn but the last is followed by one observation")
    out = list(prompt_tokens)
    for i, turn in enumerate(turns):
        out.extend(turn.tokens)
        if i < len(observations):
            out.extend(observations[i].tokens)
    return tuple(out)


def flatten(episode: Episode) -> tuple[list[int], list[int], list[float]]:
    """(response tokens, loss mask, behaviour log-probs) of everything after the prompt:
    mask 1 on model tokens, 0 on observation tokens (log-prob 0.0 there)."""
    tokens: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for i, turn in enumerate(episode.turns):
        tokens.extend(turn.tokens)
        mask.extend([1] * len(turn.tokens))
        logprobs.extend(turn.logprobs)
        if i < len(episode.observations):
            obs = episode.observations[i].tokens
            tokens.extend(obs)
            mask.extend([0] * len(obs))
            logprobs.extend([0.0] * len(obs))
    return tokens, mask, logprobs


def episode_record(episode: Episode, record_tokens: bool = False) -> dict[str, Any]:
    """The samples.jsonl record of one finished episode (see module docstring)."""
    if not episode.done:
        raise ValueError(f"episode {episode.key}: not finished (no reward)")
    tokens, mask, _ = flatten(episode)
    model_tokens = sum(mask)
    devices = sorted({t.device for t in episode.turns})
    record: dict[str, Any] = {
        "step": episode.step, "prompt": episode.prompt, "sample": episode.sample,
        "version": episode.version, "device": devices[0] if len(devices) == 1 else devices,
        "response_tokens": model_tokens, "tokens_sha256": tokens_sha256(tokens),
        "reward": round(float(episode.reward or 0.0), 6),
        "finish_reason": episode.turns[-1].finish_reason if episode.turns else "none",
        "num_turns": len(episode.turns),
        "turns": [{"tokens": len(t.tokens), "tokens_sha256": tokens_sha256(list(t.tokens)),
                   "version": t.version, "device": t.device,
                   "finish_reason": t.finish_reason} for t in episode.turns],
        "observations": [{"role": o.role, "text": o.text, "tokens": len(o.tokens)}
                         for o in episode.observations],
    }
    if record_tokens:
        record["tokens"] = tokens
        record["loss_mask"] = mask
    return record


def contract_view(record: dict[str, Any]) -> dict[str, Any]:
    """A record without the fields allowed to differ between allocations (the device)."""
    out = {k: v for k, v in record.items() if k != "device"}
    out["turns"] = [{k: v for k, v in t.items() if k != "device"} for t in record["turns"]]
    return out
