"""A real model's own tokenizer (transformers), with the interface the tasks and engines use.

`CharTokenizer` serves the tiny random model; a pretrained model (`model.path` or
`model.source`) must be fed its own token ids: `ModelTokenizer` wraps the checkpoint's
`AutoTokenizer` (loaded from the local folder only) and exposes the same `pad_id`, `bos_id`,
`eos_id`, `vocab_size`, `encode` and `decode`, plus `chat` (the model's chat template).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynaresize.tasks.tokenizer import CharTokenizer


class ModelTokenizer:
    """The tokenizer saved with a local transformers checkpoint."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        self.path = str(path)
        self._tok: Any = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        eos = self._tok.eos_token_id
        if eos is None:
            raise ValueError(f"{self.path}: the tokenizer has no EOS token")
        self.eos_id: int = int(eos)
        bos = self._tok.bos_token_id
        self.bos_id: int = int(bos) if bos is not None else self.eos_id
        pad = self._tok.pad_token_id
        self.pad_id: int = int(pad) if pad is not None else self.eos_id
        self.has_chat_template = bool(getattr(self._tok, "chat_template", None))

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(int(i) for i in self._tok.all_special_ids)

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, no special tokens added."""
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int] | tuple[int, ...], skip_special: bool = True) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special))

    def encode_prompt(self, text: str) -> tuple[int, ...]:
        """A plain-text prompt: the ids of `text` (the tokenizer's own BOS rule applies)."""
        return tuple(self._tok.encode(text, add_special_tokens=True))

    def chat(self, messages: list[dict[str, str]],
             add_generation_prompt: bool = True) -> tuple[int, ...]:
        """The ids of `messages` under the model's chat template, ready for the answer (or,
        `add_generation_prompt=False`, ending after the last message)."""
        if not self.has_chat_template:
            raise ValueError(f"{self.path}: the tokenizer has no chat template "
                             "(use task.format = 'completion')")
        ids = self._tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                            tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return tuple(int(i) for i in ids)


Tokenizer = CharTokenizer | ModelTokenizer
