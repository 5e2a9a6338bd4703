"""A fixed character-level tokenizer shared by the built-in tasks and the tiny model.

Ids: 0 PAD, 1 BOS, 2 EOS, then digits, lowercase letters and a little punctuation. The
vocabulary is a constant so that every process (and every run) agrees on it without files.
"""

from __future__ import annotations

import string

PAD = "<pad>"
BOS = "<bos>"
EOS = "<eos>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS)
CHARS: str = string.digits + string.ascii_lowercase + ":=+-*/ ,.?!'()"
"""Every ordinary character the tokenizer knows, in id order (after the specials)."""


class CharTokenizer:
    """Maps characters to ids one to one; specials PAD, BOS and EOS come first."""

    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __init__(self) -> None:
        self._id_of: dict[str, int] = {c: i + len(SPECIALS) for i, c in enumerate(CHARS)}
        self._char_of: dict[int, str] = {i: c for c, i in self._id_of.items()}
        assert self.vocab_size <= 64, self.vocab_size

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included."""
        return len(SPECIALS) + len(CHARS)

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset((self.pad_id, self.bos_id, self.eos_id))

    def unknown_chars(self, text: str) -> list[str]:
        """Characters of `text` outside the vocabulary, in order of first appearance."""
        return list(dict.fromkeys(c for c in text if c not in self._id_of))

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of `text` (no specials added).

        Raises ValueError naming the first character outside the vocabulary.
        """
        ids: list[int] = []
        for pos, ch in enumerate(text):
            tok = self._id_of.get(ch)
            if tok is None:
                raise ValueError(
                    f"character {ch!r} at position {pos} is not in the tokenizer vocabulary "
                    f"(allowed: digits, lowercase letters and {CHARS[36:]!r})")
            ids.append(tok)
        return ids

    def decode(self, ids: list[int] | tuple[int, ...], skip_special: bool = True) -> str:
        """Text of `ids`; specials are dropped (or written as `<pad>`, `<bos>`, `<eos>`)."""
        out: list[str] = []
        for tok in ids:
            tok = int(tok)
            if tok < len(SPECIALS):
                if tok < 0:
                    raise ValueError(f"token id {tok} is negative")
                if not skip_special:
                    out.append(SPECIALS[tok])
                continue
            ch = self._char_of.get(tok)
            if ch is None:
                raise ValueError(f"token id {tok} is outside the vocabulary of "
                                 f"{self.vocab_size} ids")
            out.append(ch)
        return "".join(out)

    def encode_prompt(self, text: str) -> tuple[int, ...]:
        """BOS followed by the ids of `text`: how every task starts its prompts."""
        return (self.bos_id, *self.encode(text))
