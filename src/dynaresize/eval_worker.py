"""The process behind evaluation: a greedy engine over the held-out set (torch, no Ray).

`EvalWorker(cfg_dict)` builds the task and the version-0 model like a device does;
`evaluate(version, state_dict)` loads a published version (None: version 0), generates one
greedy response (temperature 0) per held-out prompt, scores it with the task's reward and
returns `evaluation.score_responses` plus a few decoded examples. The runner hosts it in a Ray
actor of its own (`ray.remote(EvalWorker)`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from dynaresize.evaluation import score_responses

NUM_EXAMPLES = 3


class EvalWorker:
    def __init__(self, cfg_dict: dict[str, Any], threads: int = 1) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch

        from dynaresize.config import config_from_dict
        from dynaresize.models import build_model
        from dynaresize.rollout.engine import RolloutEngine
        from dynaresize.tasks import make_task

        torch.set_num_threads(threads)
        self.cfg = config_from_dict(cfg_dict)
        self.task: Any = make_task(self.cfg)
        tok = self.task.tokenizer
        model = build_model(self.cfg.model, tok.vocab_size, eos_token_id=tok.eos_id,
                            bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)
        self.prompts = self.task.eval_prompts(self.cfg.eval.num_prompts, self.cfg.run.seed)
        self.engine = RolloutEngine(model, eos_token_id=tok.eos_id, device_index=-1,
                                    max_running=len(self.prompts), batch_invariant=False)

    def evaluate(self, version: int, state_dict: dict[str, Any] | None) -> dict[str, Any]:
        from dynaresize.types import RequestSpec

        t0 = time.perf_counter()
        if state_dict is not None:
            self.engine.load_weights(state_dict, version)
        elif version != self.engine.version:
            raise ValueError(f"evaluation of version {version} got no weights")
        cap = self.cfg.eval.max_new_tokens or self.cfg.task.max_new_tokens
        for p in self.prompts:
            self.engine.add(RequestSpec(step=-1, prompt=p.id, sample=0, version=version,
                                        prompt_tokens=tuple(p.tokens), max_new_tokens=cap,
                                        seed=0, temperature=0.0))
        done = {c.spec.prompt: c for c in self.engine.run(float("inf"), until_empty=True)}
        rewards = [self.task.reward(p, list(done[p.id].tokens)) for p in self.prompts]
        result: dict[str, Any] = score_responses(rewards)
        result["eval_s"] = round(time.perf_counter() - t0, 3)
        decode = getattr(self.task, "response_text", None)
        if decode is not None:
            result["examples"] = [
                {"answer": p.answer, "response": decode(list(done[p.id].tokens)),
                 "reward": round(r, 4)}
                for p, r in zip(self.prompts[:NUM_EXAMPLES], rewards)]
        return result


def start_ray_evaluator(cfg: Any, log: Any = None) -> Any:
    """An `Evaluator` whose work runs in an `EvalWorker` Ray actor (no CPU reserved: it
    shares the machine with the devices), or None when `eval.every` is 0."""
    import ray

    from dynaresize.devices.actor import loopback_env
    from dynaresize.evaluation import Evaluator

    if not cfg.eval.every:
        return None
    actor = ray.remote(num_cpus=0)(EvalWorker).options(
        runtime_env={"env_vars": loopback_env()}).remote(cfg.to_dict(),
                                                          cfg.devices.threads_per_device)

    async def run_eval(version: int, weights: Any) -> dict[str, Any]:
        return await actor.evaluate.remote(version, weights)

    evaluator = Evaluator(cfg.eval.every, cfg.run.steps, run_eval, log)
    evaluator.actor = actor  # type: ignore[attr-defined]
    return evaluator


def stop_ray_evaluator(evaluator: Any) -> None:
    """End the evaluator's actor (if any)."""
    actor = getattr(evaluator, "actor", None)
    if actor is not None:
        import ray

        evaluator.cancel()
        ray.kill(actor)
