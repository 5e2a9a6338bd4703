"""`rollout.engine = "vllm"`: a vLLM V1 engine serving one rollout device, in the device's own
process, behind the built-in engine's interface (`dynaresize.rollout.engine.RolloutEngine`:
add, step/run, export_inflight, load_weights, version, num_running/num_waiting, stats).

vLLM is imported here only, lazily: `dynaresize train` works without it (docs/vllm.md).

* In-process engine core (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): starts in seconds and takes the
  trainer's tensors directly. vLLM creates its own world-size-1 torch.distributed world; the
  device already has one (the run's gloo world), so the engine is built inside a private
  `torch.distributed` world seen by the building thread only (`rollout.vllm_world`), kept for
  later engines; vLLM's groups have one member, so nothing it does afterwards is collective.
  vLLM's teardown (which would destroy the device's groups too) is never run.
* Exact sampling: token t's draw depends only on (request seed, t) (`rollout.vllm_sampler`), so
  a migrated request resubmitted as prompt + generated prefix continues token for token.
* Speculative decoding (`rollout.speculative.enabled`): our drafters as vLLM's custom
  proposer, our draw in front of its greedy verification (`rollout.vllm_speculative`).
* Batch of one: vLLM's CPU GEMMs round differently for a single decoding sequence than for any
  batch of 2+, so when exactly one request runs the engine adds a companion request (greedy,
  discarded) and never decodes a batch of one. Cost: one extra sequence while a request runs
  alone (the tail), nothing otherwise.
* Weight sync in place: `reload_weights(weights_iterator=...)`, then `reset_prefix_cache()`
  (cached blocks hold keys/values of the old weights); a failed reload leaves meta tensors and
  is recovered by reloading once more.
* KV cache: on CUDA `release_kv`/`alloc_kv` are vLLM's sleep(level=1)/wake_up. On CPU vLLM's
  sleep does nothing and its KV pool cannot be freed while the engine lives: `release_kv`
  drops every cached block (`reset_prefix_cache`) and keeps the pool
  (`rollout.vllm_kv_cache_bytes`); the memory is returned when the device drops its engine
  (`release_rollout_weights` shuts the engine down).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import os
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.rollout.engine_base import EngineBase
from dynaresize.rollout.speculative import Speculation, SpeculationSettings
from dynaresize.rollout.vllm_speculative import REQUEST, VllmDrafting, install
from dynaresize.rollout.vllm_world import private_world

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # several devices share the cores
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

@dataclass
class _Live:
    """A request inside vLLM: its spec and every token generated so far (also before a
    migration), with their log-probs."""

    spec: RequestSpec
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class VllmRolloutEngine(EngineBase):
    """One vLLM engine: continuous batching, exact seeded sampling, migration by resubmission
    (the common part: `EngineBase`; sampling is never greedy)."""

    greedy_ok = False
    context_limit_name = "max_model_len"

    def __init__(self, model_path: str, *, eos_token_id: int | None, device_index: int,
                 max_running: int = 32, max_model_len: int = 512,
                 kv_cache_bytes: int = 256 * 2**20, torch_device: str = "cpu",
                 dtype: str = "float32", companion: bool = True,
                 speculation: SpeculationSettings | None = None) -> None:
        """`eos_token_id` None: requests stop at `max_new_tokens` only (benchmarks);
        `speculation`: draft and verify (`rollout.vllm_speculative`)."""
        super().__init__(eos_token_id=eos_token_id, device_index=device_index,
                         max_running=max_running, max_context_tokens=max_model_len)
        self._filler = eos_token_id or 0
        """Token of the warm-up and companion prompts."""
        self.max_model_len = max_model_len
        self.on_cuda = torch_device.startswith("cuda")
        self.companion = companion
        self.kv_released = False
        self._live: dict[str, _Live] = {}
        self._ids = itertools.count()
        self._companion_id: str | None = None
        self.drafting = None if speculation is None else VllmDrafting(speculation)
        self.speculation: Speculation | None = \
            None if self.drafting is None else self.drafting.speculation
        """Drafting state and acceptance counters (None: speculation off)."""
        t0 = time.perf_counter()
        with private_world():
            from vllm import LLM

            self.llm = LLM(model=model_path, skip_tokenizer_init=True, dtype=dtype,
                           enforce_eager=True, enable_chunked_prefill=False,
                           max_model_len=max_model_len,
                           max_num_batched_tokens=max(max_model_len, 2048),
                           max_num_seqs=max_running + 1, kv_cache_memory_bytes=kv_cache_bytes,
                           logprobs_mode="processed_logits", max_logprobs=0,
                           distributed_executor_backend="uni", seed=0,
                           enable_sleep_mode=self.on_cuda, **_sampling_args(speculation))
        self.engine = self.llm.llm_engine
        # vLLM's teardown (also its finaliser's) destroys every torch.distributed group of the
        # process, the device's too: `shutdown` frees the engine without it, on a failure too.
        finalizer = getattr(self.engine.engine_core, "_finalizer", None)
        if finalizer is not None:
            finalizer.detach()
        try:
            self._finish_start()
        except BaseException:
            self.shutdown()
            raise
        self.start_s = time.perf_counter() - t0
        """Seconds to start the engine and run its first (warm-up) forwards."""

    def _finish_start(self) -> None:
        """After vLLM started: the vocabulary `add` checks, the drafting hook, the warm-up."""
        self.vocab_size = self.engine.model_config.get_vocab_size()
        if self.drafting is not None:
            self.llm.collective_rpc(functools.partial(install, drafting=self.drafting))
            if not self.drafting.installed:  # the worker got a copy: another process
                raise RuntimeError("rollout.speculative on vLLM needs its in-process engine "
                                   "core (VLLM_ENABLE_V1_MULTIPROCESSING=0, this module's "
                                   "default); it is set to "
                                   f"{os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING')!r}")
        self._warm_up()

    def _warm_up(self) -> None:
        """Two short greedy requests: the first forwards of a new engine take seconds on CPU
        (kernel set-up), which would otherwise land in the first rollout."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, detokenize=False)
        for i in range(2):
            self.engine.add_request(f"warm-up-{i}", {"prompt_token_ids": [self._filler] * 3},
                                    params)
        while self.engine.has_unfinished_requests():
            self.engine.step()

    def _active(self) -> Collection[_Live]:
        return self._live.values()

    def load_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Reload every parameter in place from `state_dict` (transformers names), drop the
        prefix cache, set `version`. A failed reload is retried once (it leaves meta tensors)."""
        self._check_load(version)
        self._abort_companion()
        self.alloc_kv()
        try:
            self._reload(state_dict)
        except Exception:
            self._reload(state_dict)
        self.version = version

    def _reload(self, state_dict: Mapping[str, Any]) -> None:
        self.llm.collective_rpc("reload_weights",
                                kwargs={"weights_iterator": iter(list(state_dict.items()))})
        self.llm.reset_prefix_cache()

    # ------------------------------------------------------------------ requests out
    def export_inflight(self) -> list[InflightRequest]:
        """Abort every request and return it with its generated prefix and log-probs (running
        first, in admission order, then queued); the engine is empty."""
        if self._live:
            self.engine.abort_request(list(self._live))
        if self.drafting is not None:
            for request_id in self._live:
                self.drafting.remove(request_id)
        self._abort_companion()
        out = [InflightRequest(spec=r.spec, generated=list(r.generated),
                               logprobs=list(r.logprobs)) for r in self._live.values()]
        out.extend(self._waiting)
        self._live.clear()
        self._waiting.clear()
        return out

    # ------------------------------------------------------------------ decoding
    def step(self) -> list[Completion]:
        """Submit queued requests, run one vLLM engine step, return the finished requests."""
        if not self._waiting and not self._live:
            return []
        t0 = time.perf_counter()
        self._admit_waiting(self._submit)  # one vLLM refuses leaves the queue (builtin alike)
        self._keep_company()
        finished: list[Completion] = []
        for out in self.engine.step():
            if out.request_id == self._companion_id:
                if out.finished:
                    self._companion_id = None
                continue
            live = self._live.get(out.request_id)
            if live is None:
                continue
            comp = out.outputs[0]
            new = list(comp.token_ids)
            live.generated.extend(new)
            live.logprobs.extend(float(lp[tok].logprob) for lp, tok in zip(comp.logprobs, new))
            self.stats.num_generated_tokens += len(new)
            if out.finished:
                del self._live[out.request_id]
                if self.drafting is not None:
                    self.drafting.finish(out.request_id, len(live.generated))
                reason = "eos" if live.generated[-1] == self.eos_token_id else "length"  # kept
                finished.append(Completion(spec=live.spec, tokens=live.generated,
                                           logprobs=live.logprobs, finish_reason=reason,
                                           device=self.device_index,
                                           engine_version=self.version))
        if not self._live:
            self._abort_companion()
        self.stats.num_decode_iterations += 1
        self.stats.busy_s += time.perf_counter() - t0
        return finished

    def _submit(self, item: InflightRequest) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from dynaresize.rollout.gumbel import OFFSET, SEED, TEMPERATURE

        spec = item.spec
        context = [*spec.prompt_tokens, *item.generated]
        remaining = spec.max_new_tokens - len(item.generated)  # >= 1, fits max_model_len (add)
        request_id = f"{spec.step}-{spec.prompt}-{spec.sample}-{next(self._ids)}"
        params = SamplingParams(
            # the run's EOS only: with ignore_eos false vLLM also stops at every EOS id of the
            # checkpoint's generation_config.json (a response cut at a token the run does not
            # treat as EOS, and labelled 'length'); a stop token id ends it the same way
            temperature=0.0, max_tokens=remaining, ignore_eos=True,
            stop_token_ids=[] if self.eos_token_id is None else [self.eos_token_id], logprobs=0,
            detokenize=False, output_kind=RequestOutputKind.DELTA,
            extra_args={SEED: spec.seed, OFFSET: len(item.generated),
                        TEMPERATURE: spec.temperature, REQUEST: request_id})
        self.engine.add_request(request_id, {"prompt_token_ids": context}, params)
        self._live[request_id] = _Live(spec, list(item.generated), list(item.logprobs))
        if self.drafting is not None:
            self.drafting.start(request_id, spec, item.generated)
        self.stats.num_prefill_tokens += len(context)

    def _keep_company(self) -> None:
        """Never decode a batch of one: a lone request gets a companion (greedy, discarded)."""
        if not self.companion or len(self._live) != 1 or self._companion_id is not None:
            return
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._companion_id = f"companion-{next(self._ids)}"
        params = SamplingParams(temperature=0.0, max_tokens=self.max_model_len - 1,
                                ignore_eos=True, detokenize=False,
                                output_kind=RequestOutputKind.DELTA)
        self.engine.add_request(self._companion_id, {"prompt_token_ids": [self._filler]},
                                params)

    def _abort_companion(self) -> None:
        if self._companion_id is not None:
            self.engine.abort_request([self._companion_id])
            self._companion_id = None

    # ------------------------------------------------------------------ memory
    def release_kv(self) -> None:
        """CUDA: vLLM sleep (level 1: KV cache freed, weights offloaded to host). CPU: drop
        every cached block; the KV pool itself stays allocated (vLLM cannot free it on CPU)."""
        assert not self._live and not self._waiting
        self._abort_companion()
        if self.on_cuda:
            self.llm.sleep(level=1)
        else:
            self.llm.reset_prefix_cache()
        self.kv_released = True

    def alloc_kv(self) -> None:
        """CUDA: vLLM wake_up. CPU: nothing to do (the pool was kept)."""
        if self.kv_released and self.on_cuda:
            self.llm.wake_up()
        self.kv_released = False

    def shutdown(self) -> None:
        """Free the engine's weights and KV pool. vLLM's private distributed world stays for
        the next engine of this process (its teardown would destroy the device's groups)."""
        core = getattr(self.engine.engine_core, "engine_core", None)
        with contextlib.suppress(Exception):
            if core is not None and core.model_executor is not None:
                core.model_executor.shutdown()
        self.llm = self.engine = None  # type: ignore[assignment]
        gc.unfreeze()  # vLLM's start-up froze every object then alive: let them be collected
        gc.collect()


def _sampling_args(speculation: SpeculationSettings | None) -> dict[str, Any]:
    """vLLM's arguments for our sampler: the logits processor, or (speculation on, where vLLM
    refuses custom processors) the custom proposer, whose `install` puts the draw in front of
    vLLM's greedy verification."""
    if speculation is None:
        return {"logits_processors": ["dynaresize.rollout.vllm_sampler:GumbelMaxLogitsProcessor"]}
    return {"speculative_config": {
        "method": "custom_class", "model": "dynaresize.rollout.vllm_speculative.DraftProposer",
        "num_speculative_tokens": speculation.max_draft_tokens}}
