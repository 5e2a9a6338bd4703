"""Memory cuts of exact reduction, each bitwise neutral: on one rank the replica's parameters
are the shards' storage (no second copy), and `finish` consumes the held gradients."""

from __future__ import annotations

import dataclasses

import torch

from dynaresize.config import TrainConfig
from dynaresize.core.types import TrainSample
from dynaresize.train import global_num_tokens, make_micro_batches
from dynaresize.train.trainer import FSDPTrainer

CONFIG = TrainConfig(lr=3e-3, micro_batch_size=2, clip_eps=0.2, max_grad_norm=1.0)
EXACT = dataclasses.replace(CONFIG, exact_reduction=True)


def make_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1234)
    cfg = Qwen2Config(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def make_samples(step: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(step)
    samples = []
    for i in range(6):
        tokens = torch.randint(1, 32, (3 + i,), generator=g).tolist()
        samples.append(TrainSample(step, i // 2, i % 2, tokens[:3], tokens[3:] or [1],
                                   [-3.4] * max(1, i), 1.0 - 2 * (i % 2), float(i % 2)))
    return samples


def shares_storage(trainer: FSDPTrainer) -> bool:
    assert trainer.exact is not None
    replica = dict(trainer.exact.replica.named_parameters())
    return all(replica[name].data_ptr() == p.to_local().data_ptr()
               for name, p in trainer.model.named_parameters())


def train(trainer: FSDPTrainer, steps: int) -> None:
    for step in range(steps):
        samples = make_samples(step)
        micro = make_micro_batches(samples, EXACT.micro_batch_size)
        trainer.accumulate(step, list(enumerate(micro)))
        trainer.finish(step, len(micro), global_num_tokens(samples))
        assert trainer.exact is not None and trainer.exact.held is None


def test_one_rank_replica_is_the_shards_and_updates_bitwise_as_a_copy(group: object) -> None:
    shared = FSDPTrainer(make_model, EXACT, group, generation=1)
    copied = FSDPTrainer(make_model, EXACT, group, generation=2)
    assert copied.exact is not None
    copied.exact.shared = False  # the two-copy path: an own replica, re-gathered by copy
    for p in copied.exact.replica.parameters():
        p.data = p.data.clone()
    assert shares_storage(shared) and not shares_storage(copied)
    train(shared, 2)
    train(copied, 2)
    assert shares_storage(shared)  # AdamW wrote in place; the replica still reads the shards
    assert shared.param_checksum() == copied.param_checksum()


def test_gradient_checkpointing_recomputes_and_updates_bitwise_the_same(group: object) -> None:
    plain = FSDPTrainer(make_model, EXACT, group, generation=3)
    recomputed = FSDPTrainer(make_model, dataclasses.replace(EXACT, gradient_checkpointing=True),
                             group, generation=4)
    assert recomputed.exact is not None and plain.exact is not None
    assert recomputed.exact.replica.is_gradient_checkpointing
    assert not plain.exact.replica.is_gradient_checkpointing
    train(plain, 2)
    train(recomputed, 2)
    assert plain.param_checksum() == recomputed.param_checksum()
