"""FSDPTrainer's FSDP path (`exact_reduction=False`) across layouts: R = 1, 2 (a subgroup of
a 3-rank world) and 3 ranks give the same parameters after the same steps within float
reduction order (design §2.4); full state moves from a 2-rank to a 3-rank
group exactly; the trainer's first gradient equals a plain single-process computation.

Two spawned jobs (gloo on 127.0.0.1, one torch thread per process), run concurrently:
- "single" (world 1): 4 steps; checks against a plain model.
- "world3" (world 3): A) group {0,1,2}, 4 steps from scratch; B) group {1,2} (rank 0 only
  calls new_group), 3 steps from scratch; C) B's full model + optimizer state loaded into a
  new generation over the cached group {0,1,2}, then step 4.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_jobs import file_store, init_gloo, run_jobs

from dynaresize.config import TrainConfig
from dynaresize.core.types import TrainSample

NUM_PROMPTS, GROUP_SIZE, NUM_STEPS = 4, 4, 4
CONFIG = TrainConfig(lr=3e-3, micro_batch_size=2, clip_eps=0.2, kl_coef=0.05, max_grad_norm=1.0,
                     exact_reduction=False)  # the FSDP path; exact: test_trainer_dist_exact
TOL = 1e-4
JOB_TIMEOUT_S = 150.0


def make_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1234)
    cfg = Qwen2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def make_samples(step: int) -> list[TrainSample]:
    from dynaresize.train import group_advantages

    g = torch.Generator().manual_seed(7)
    rewards = torch.randint(0, 2, (NUM_PROMPTS * GROUP_SIZE,), generator=g).tolist()
    advantages = group_advantages([float(r) for r in rewards], GROUP_SIZE)
    samples = []
    for i in range(NUM_PROMPTS * GROUP_SIZE):
        num_prompt = 3 + i // GROUP_SIZE
        num_response = int(torch.randint(1, 10, (1,), generator=g))
        tokens = torch.randint(1, 32, (num_prompt + num_response,), generator=g).tolist()
        behavior = (-3.47 + 0.2 * torch.randn(num_response, generator=g)).tolist()
        samples.append(TrainSample(step, i // GROUP_SIZE, i % GROUP_SIZE, tokens[:num_prompt],
                                   tokens[num_prompt:], behavior, advantages[i], rewards[i]))
    return samples[::-1]  # the planner must sort them


def run_steps(trainer, steps: range, group_rank: int, num_ranks: int) -> list[dict]:
    from dynaresize.train import global_num_tokens, plan_step

    metrics = []
    for step in steps:
        samples = make_samples(step)
        plan = plan_step(samples, CONFIG.micro_batch_size, num_ranks)
        metrics.append(trainer.train_step(plan[group_rank], global_num_tokens(samples)))
    return metrics


def plain_first_step(out: Path) -> None:
    """Loss and gradient norm of the global token-mean loss, one process, no FSDP."""
    from dynaresize.train import kl_penalty_sum, pack, ppo_clip_loss_sum, token_logprobs

    model = make_model()
    batch = pack(sorted(make_samples(0), key=lambda s: (s.prompt, s.sample)))
    logprobs = token_logprobs(model(input_ids=batch.input_ids).logits, batch.targets)
    loss = ppo_clip_loss_sum(logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask,
                             CONFIG.clip_eps)
    loss = loss + CONFIG.kl_coef * kl_penalty_sum(logprobs, logprobs.detach(), batch.loss_mask)
    loss = loss / batch.num_tokens
    loss.backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    torch.save({"loss": float(loss), "grad_norm": float(norm)}, out / "plain.pt")


def scenario_single(rank: int, out: Path) -> None:
    from dynaresize.train import FSDPTrainer, checksum_named_tensors, plan_step

    trainer = FSDPTrainer(make_model, CONFIG, dist.new_group([0]), generation=0)
    samples = make_samples(0)
    with pytest.raises(ValueError, match="response tokens"):  # wrong denominator: no step
        trainer.train_step(plan_step(samples, CONFIG.micro_batch_size, 1)[0], 1)
    metrics = run_steps(trainer, range(3), 0, 1)
    torch.save(trainer.full_state_dict(), out / "single_3.pt")
    metrics += run_steps(trainer, range(3, 4), 0, 1)
    sd = trainer.full_state_dict()
    torch.save({"sd": sd, "metrics": metrics, "checksum": trainer.param_checksum()},
               out / "single_4.pt")
    plain = make_model()
    plain.load_state_dict(sd, strict=True)
    torch.save(checksum_named_tensors(plain.named_parameters()), out / "plain_checksum.pt")
    plain_first_step(out)


def scenario_world3(rank: int, out: Path) -> None:
    from dynaresize.train import FSDPTrainer

    everyone = dist.new_group([0, 1, 2])
    pair = dist.new_group([1, 2])  # every world rank calls new_group, in the same order
    # A: 3 ranks from scratch.
    trainer = FSDPTrainer(make_model, CONFIG, everyone, generation=1)
    with pytest.raises(ValueError, match="rounds"):  # unequal rounds fail on every rank
        trainer.train_step([None] * (1 + (rank == 0)), 1)
    metrics = run_steps(trainer, range(3), rank, 3)
    sd3 = trainer.full_state_dict()
    metrics += run_steps(trainer, range(3, 4), rank, 3)
    sd4 = trainer.full_state_dict()
    if rank == 0:
        torch.save({"sd3": sd3, "sd4": sd4, "metrics": metrics}, out / "world3_A.pt")
    del trainer
    gc.collect()
    # B: the subgroup {1, 2}; world rank 0 is idle (a rollout device).
    state: list = [None, None, None]
    if rank in (1, 2):
        trainer = FSDPTrainer(make_model, CONFIG, pair, generation=2)
        metrics = run_steps(trainer, range(3), dist.get_rank(pair), 2)
        checksum = trainer.param_checksum()
        state = [trainer.full_state_dict(), trainer.full_optim_state_dict(), checksum]
        torch.save({"metrics": metrics, "checksum": checksum}, out / f"world3_B_rank{rank}.pt")
        del trainer
        gc.collect()
    # C: resize to {0, 1, 2}: B's state (on world rank 1) becomes the new group's rank 0 state.
    dist.broadcast_object_list(state, src=1)
    model_sd, optim_sd, checksum_b = state
    trainer = FSDPTrainer(make_model, CONFIG, everyone, generation=3)
    t0 = time.perf_counter()
    trainer.load_full_state(model_sd if rank == 0 else None, optim_sd if rank == 0 else None)
    load_s = time.perf_counter() - t0
    checksum_c = trainer.param_checksum()
    metrics = run_steps(trainer, range(3, 4), rank, 3)
    sd = trainer.full_state_dict()
    if rank == 0:
        torch.save({"sd3": state[0], "sd4": sd, "checksum_b": checksum_b,
                    "checksum_c": checksum_c, "metrics": metrics, "load_s": load_s},
                   out / "world3_C.pt")


def worker(rank: int, world_size: int, store: str, scenario: str, out: str) -> None:
    init_gloo(rank, world_size, store)
    try:
        {"single": scenario_single, "world3": scenario_world3}[scenario](rank, Path(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trainer_dist")
    run_jobs([(worker, n, (n, file_store(out, name), name, str(out)))
              for name, n in (("single", 1), ("world3", 3))], JOB_TIMEOUT_S,
             "distributed trainer job")
    return out


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_layouts_agree(results: Path) -> None:
    single3 = torch.load(results / "single_3.pt")
    single4 = torch.load(results / "single_4.pt")
    world_a = torch.load(results / "world3_A.pt")
    world_c = torch.load(results / "world3_C.pt")
    assert max_abs_diff(single3, make_model().state_dict()) > 1e-3  # training moved them
    assert max_abs_diff(single3, world_a["sd3"]) < TOL  # R = 3
    assert max_abs_diff(single3, world_c["sd3"]) < TOL  # R = 2, subgroup {1, 2}
    assert max_abs_diff(single4["sd"], world_a["sd4"]) < TOL
    assert max_abs_diff(single4["sd"], world_c["sd4"]) < TOL  # resized 2 → 3 after step 3
    b_metrics = torch.load(results / "world3_B_rank1.pt")["metrics"]
    for key in ("loss", "grad_norm", "clip_fraction", "tokens"):
        for r1, r3 in zip(single4["metrics"], world_a["metrics"]):
            assert r1[key] == pytest.approx(r3[key], rel=TOL, abs=TOL)
        for r1, r2 in zip(single4["metrics"], b_metrics):
            assert r1[key] == pytest.approx(r2[key], rel=TOL, abs=TOL)


def test_first_step_matches_plain_gradient(results: Path) -> None:
    plain = torch.load(results / "plain.pt")
    first = torch.load(results / "single_4.pt")["metrics"][0]
    assert first["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-6)
    assert first["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
    assert first["grad_norm"] > CONFIG.max_grad_norm or first["clip_fraction"] > 0


def test_checksums_and_resize_state(results: Path) -> None:
    single4 = torch.load(results / "single_4.pt")
    assert torch.load(results / "plain_checksum.pt") == single4["checksum"]
    b1 = torch.load(results / "world3_B_rank1.pt")["checksum"]
    b2 = torch.load(results / "world3_B_rank2.pt")["checksum"]
    world_c = torch.load(results / "world3_C.pt")
    assert b1 == b2 == world_c["checksum_b"] == world_c["checksum_c"]  # exact, bytes included
