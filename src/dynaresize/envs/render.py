"""Observation text → the tokens appended to an episode's context (and model tokens → text).

The context is a token stream that only grows (envs.episode): the model's tokens are kept as
sampled and an observation adds tokens after them. Rendering the whole conversation again from
text each turn is not the same thing (a re-tokenised turn may split differently from how it was
sampled, and the trainer would then train on tokens the model never produced).

* `PlainRenderer`: any tokenizer; the observation is `template.format(role=, text=)` encoded,
  e.g. for the tiny character model. A turn cut at `max_new_tokens` (no EOS) gets an EOS first.
* `ChatRenderer`: a model tokenizer with a chat template (e.g. SmolLM2's ChatML). The tokens of
  an observation are the template's own *delta*: the text the template puts after an
  assistant message's end token, then the observation as a `tool` or `user` message, then the
  generation prompt for the next assistant turn. Computed once per role from two renderings of
  a probe conversation and checked to be a strict extension (else the template is not
  append-only and the renderer refuses it).
"""

from __future__ import annotations

from typing import Protocol

from dynaresize.envs.base import ROLES


class PlainTokenizer(Protocol):
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int] | tuple[int, ...], skip_special: bool = True) -> str: ...


class ChatTokenizer(PlainTokenizer, Protocol):
    def chat(self, messages: list[dict[str, str]],
             add_generation_prompt: bool = True) -> tuple[int, ...]: ...


class Renderer(Protocol):
    """How an episode's text turns into context tokens and back."""

    def observation(self, text: str, role: str, ended_with_eos: bool) -> tuple[int, ...]:
        """Tokens appended after a model turn (that ended with EOS or not) for `text`."""
        ...

    def decode(self, tokens: tuple[int, ...] | list[int]) -> str:
        """A model turn's text (before its first EOS, specials dropped)."""
        ...


def _body(tokens: tuple[int, ...] | list[int], eos_id: int) -> list[int]:
    body = list(tokens)
    return body[:body.index(eos_id)] if eos_id in body else body


class PlainRenderer:
    """Observations as plain encoded text (see module docstring)."""

    def __init__(self, tokenizer: PlainTokenizer, template: str = " {role}: {text} ") -> None:
        self.tokenizer = tokenizer
        self.template = template

    def observation(self, text: str, role: str, ended_with_eos: bool) -> tuple[int, ...]:
        ids = self.tokenizer.encode(self.template.format(role=role, text=text))
        return tuple(ids) if ended_with_eos else (self.tokenizer.eos_id, *ids)

    def decode(self, tokens: tuple[int, ...] | list[int]) -> str:
        return self.tokenizer.decode(_body(tokens, self.tokenizer.eos_id))


PROBE = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]


class ChatRenderer:
    """Observations as chat-template messages (see module docstring)."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer
        closed = list(tokenizer.chat(PROBE, add_generation_prompt=False))
        if tokenizer.eos_id not in closed:
            raise ValueError("chat template: an assistant message does not end with the "
                             f"EOS token {tokenizer.eos_id}; the model could not end a turn")
        end = len(closed) - closed[::-1].index(tokenizer.eos_id)
        self._closed = closed
        self._after_eos = tuple(closed[end:])
        """What the template writes after an assistant message's EOS (e.g. a newline)."""
        self._wrap: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
            role: self._role_wrap(role) for role in ROLES}

    def _role_wrap(self, role: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(tokens before, tokens after) the message text of `role`, generation prompt
        included after; found from a probe message whose text tokens are located exactly."""
        marker = "XOBSX"
        full = list(self.tokenizer.chat([*PROBE, {"role": role, "content": marker}]))
        if full[:len(self._closed)] != self._closed:
            raise ValueError(f"chat template: adding a {role!r} message re-renders earlier "
                             "turns (not append-only); use PlainRenderer")
        delta = full[len(self._closed):]
        mark = self.tokenizer.encode(marker)
        for i in range(len(delta) - len(mark) + 1):
            if delta[i:i + len(mark)] == mark:
                return tuple(delta[:i]), tuple(delta[i + len(mark):])
        raise ValueError(f"chat template: cannot locate a {role!r} message's text in its "
                         "rendering (it is transformed); use PlainRenderer")

    def observation(self, text: str, role: str, ended_with_eos: bool) -> tuple[int, ...]:
        if role not in self._wrap:
            raise ValueError(f"observation role = {role!r}: allowed: {', '.join(ROLES)}")
        before, after = self._wrap[role]
        close = self._after_eos if ended_with_eos else (self.tokenizer.eos_id, *self._after_eos)
        return (*close, *before, *self.tokenizer.encode(text), *after)

    def decode(self, tokens: tuple[int, ...] | list[int]) -> str:
        return self.tokenizer.decode(_body(tokens, self.tokenizer.eos_id))
