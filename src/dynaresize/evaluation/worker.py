"""The process behind evaluation: a greedy engine over the held-out set (torch, no Ray).

`EvalWorker(cfg_dict)` builds the task and the version-0 model like a device does;
`evaluate(version, state_dict)` takes a published version (None: version 0), generates one
greedy response per held-out prompt (`greedy_generate`: left-padded batches, one prefill per
batch; measured ~3x faster than per-request prefill on 64 prompts), scores it with the task's
reward and returns `evaluation.score_responses` plus a few decoded examples. The runner hosts
it in a Ray actor of its own (`start_ray_evaluator`).

Memory (docs/faults.md, memory): the model's parameters are the received tensors themselves
(`load_state_dict(assign=True)`: no second copy), and between evaluations the worker holds
no weights (`release_weights`: parameters on the meta device, free pages handed back); an
evaluation of version 0 after that rebuilds the model. Neither changes a result.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

from dynaresize.evaluation.evaluator import score_responses

NUM_EXAMPLES = 3
BATCH = 16
"""Held-out prompts per generation batch."""


def greedy_generate(model: Any, prompts: list[tuple[int, ...]], max_new_tokens: int,
                    eos_id: int, pad_id: int, batch: int = BATCH) -> list[list[int]]:
    """Greedy responses (EOS kept, nothing after it) of `prompts`, in left-padded batches."""
    import torch

    out: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, p in enumerate(chunk):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        with torch.inference_mode():
            gen = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=eos_id,
                                 pad_token_id=pad_id)
        for row in gen[:, width:].tolist():
            cut = row.index(eos_id) + 1 if eos_id in row else len(row)
            out.append(row[:cut])
    return out


class EvalWorker:
    def __init__(self, cfg_dict: dict[str, Any], threads: int = 1) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch

        from dynaresize.config import config_from_dict
        from dynaresize.models import build_model
        from dynaresize.tasks import make_task

        torch.set_num_threads(threads)
        self.cfg = config_from_dict(cfg_dict)
        self.task: Any = make_task(self.cfg)
        tok = self.task.tokenizer
        self._build = functools.partial(build_model, self.cfg.model, tok.vocab_size,
                                        eos_token_id=tok.eos_id, bos_token_id=tok.bos_id,
                                        pad_token_id=tok.pad_id)
        self.model = self._build().requires_grad_(False)
        self.version: int | None = 0
        """The version the model's parameters hold; None: released (`release_weights`)."""
        self.prompts = self.task.eval_prompts(self.cfg.eval.num_prompts, self.cfg.run.seed)

    def release_weights(self) -> None:
        """Let go of the parameters (each becomes a meta tensor of its shape, so the next
        `load_state_dict(assign=True)` fits) and hand the freed pages back to the OS. The
        runner calls it once more after `evaluate` returns: only then are the received
        weights (the call's argument) freed."""
        import torch

        from dynaresize.devices.memory import release_free_memory

        if self.version is not None:
            for module in self.model.modules():
                for name, param in list(module.named_parameters(recurse=False)):
                    module.register_parameter(name, torch.nn.Parameter(
                        torch.empty_like(param, device="meta"), requires_grad=False))
            self.version = None
        release_free_memory()

    def load_version(self, version: int, state_dict: dict[str, Any] | None) -> None:
        """Make the model hold `version`: the received tensors become its parameters (tied
        weights arrive as one tensor under both keys and stay tied); version 0 without
        weights rebuilds the model if it was released."""
        if state_dict is not None:
            from dynaresize.devices.memory import release_free_memory
            from dynaresize.devices.weights_wire import from_wire

            # the parameters become read-only views of the object store's pages (no copy)
            self.model.load_state_dict(from_wire(state_dict), strict=True, assign=True)
            self.model.requires_grad_(False)
            release_free_memory()  # what receiving left free (in-band tensors: ~0.4 GB)
        elif version != 0:
            raise ValueError(f"evaluation of version {version} got no weights")
        elif self.version != 0:
            self.model = self._build().requires_grad_(False)
        self.version = version

    def evaluate(self, version: int, state_dict: dict[str, Any] | None) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.load_version(version, state_dict)
        try:
            return self._evaluate(t0)
        finally:
            self.release_weights()

    def _evaluate(self, t0: float) -> dict[str, Any]:
        tok = self.task.tokenizer
        cap = self.cfg.eval.max_new_tokens or self.cfg.task.max_new_tokens
        responses = greedy_generate(self.model, [tuple(p.tokens) for p in self.prompts], cap,
                                    tok.eos_id, tok.pad_id)
        rewards = [self.task.reward(p, r) for p, r in zip(self.prompts, responses)]
        result: dict[str, Any] = score_responses(rewards)
        result["eval_s"] = round(time.perf_counter() - t0, 3)
        decode = getattr(self.task, "response_text", None)
        if decode is not None:
            result["examples"] = [
                {"answer": p.answer, "response": decode(r), "reward": round(x, 4)}
                for p, r, x in zip(self.prompts[:NUM_EXAMPLES], responses, rewards)]
        return result


MAX_RESTARTS = 3
"""A dead evaluation actor (killed, or taken by Ray's memory monitor) is restarted up to this
many times; the evaluation it was running is retried once on the new one, else skipped."""


def start_ray_evaluator(cfg: Any, log: Any = None, warn: Any = None) -> Any:
    """An `Evaluator` whose work runs in an `EvalWorker` Ray actor (no CPU reserved: it
    shares the machine with the devices), or None when `eval.every` is 0. The actor restarts
    if it dies (`MAX_RESTARTS`); an evaluation that still fails is skipped with `warn`."""
    import ray

    from dynaresize.devices.actor import loopback_env
    from dynaresize.evaluation.evaluator import Evaluator

    if not cfg.eval.every:
        return None
    actor = ray.remote(num_cpus=0, max_restarts=MAX_RESTARTS, max_task_retries=1)(
        EvalWorker).options(
        runtime_env={"env_vars": loopback_env()}).remote(cfg.to_dict(),
                                                          cfg.devices.threads_per_device)

    async def run_eval(version: int, weights: Any) -> dict[str, Any]:
        result = await actor.evaluate.remote(version, weights)
        try:  # the weights (the call's argument) are freed now: hand their pages back
            await actor.release_weights.remote()
        except Exception:  # noqa: BLE001 (memory only: a worker gone now costs nothing here)
            pass
        return result

    evaluator = Evaluator(cfg.eval.every, cfg.run.steps, run_eval, log, warn)
    evaluator.actor = actor  # type: ignore[attr-defined]
    return evaluator


def stop_ray_evaluator(evaluator: Any) -> None:
    """End the evaluator's actor (if any)."""
    actor = getattr(evaluator, "actor", None)
    if actor is not None:
        import ray

        evaluator.cancel()
        ray.kill(actor)
