"""What a device process receives of the run's config: its own part only (`DeviceSettings`).

A device builds the version-0 model (`model`, the tokenizer's ids in `tokens`), its rollout
engine (`rollout`) and its trainer (`train`, plus the sampling temperature the loss reweights
by). The driver builds the settings once (`DeviceSettings.build`) from the validated config
and the task's tokenizer; a device never rebuilds the task or the whole config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dynaresize.config import Config, ModelConfig, RolloutConfig, TrainConfig


class TokenizerIds(Protocol):
    vocab_size: int
    eos_id: int
    bos_id: int
    pad_id: int


@dataclass(frozen=True)
class TokenIds:
    """The four ids of the task's tokenizer a model is built with."""

    vocab_size: int
    eos_id: int
    bos_id: int
    pad_id: int


@dataclass(frozen=True)
class DeviceSettings:
    model: ModelConfig
    rollout: RolloutConfig
    train: TrainConfig
    tokens: TokenIds
    max_new_tokens: int
    """`task.max_new_tokens`: the loss's constant normaliser (`train.loss.aggregation`)."""

    @classmethod
    def build(cls, cfg: Config, tokenizer: TokenizerIds) -> DeviceSettings:
        """The device's part of `cfg` (copied: the settings never change with the config)."""
        from copy import deepcopy

        return cls(deepcopy(cfg.model), deepcopy(cfg.rollout), deepcopy(cfg.train),
                   TokenIds(int(tokenizer.vocab_size), int(tokenizer.eos_id),
                            int(tokenizer.bos_id), int(tokenizer.pad_id)),
                   int(cfg.task.max_new_tokens))
