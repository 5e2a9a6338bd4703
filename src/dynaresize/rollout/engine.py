"""Built-in rollout engine: continuous batching over a transformers causal LM (pure torch, no Ray).

One engine serves one rollout device. Requests queue FIFO (`add`), are admitted while fewer than
`max_running` run, decode one token per `step`, and leave the running set when they stop (EOS,
which is kept in the tokens, or `max_new_tokens`). `export_inflight` empties the engine and returns
every request with its token prefix, log-probs and sampler state, so that another engine holding
the same weights continues it token-for-token (design §2.3).

Determinism, by construction:

* Sampling: each request owns a CPU `torch.Generator` seeded with `spec.seed`; one uniform draw per
  token picks the token by inverse CDF over the float64 cumulative softmax of `logits/temperature`.
  Logits are moved to the CPU before sampling, so the sampler is the same on every device.
* Batch invariance (`batch_invariant=True`, default): every forward has batch 1, runs over the
  request's own KV cache, and feeds exactly one token. The context (prompt, plus the generated
  prefix of a migrated request) is prefilled one token at a time through that same path, so an
  imported request rebuilds bit-identical caches and logits. Cost: one forward per token per
  request, no GEMM batching. Measured, 1 CPU thread, 3M-param Qwen2, 8-token prompts: ~800
  tokens/s at running batch 1 and at 16, against ~4k tokens/s at 16 for the batched mode below.
  `whole_prompt_prefill=True` feeds the prompt (minus its last token) in one batch-1 forward
  instead: still independent of the batch and replayed identically by an importing engine
  (prompt chunk, then the prefix token by token), ~6x cheaper for a 36-token prompt on a 135M
  model; its rounding differs from the token-by-token path, so samples differ from that mode.
* `batch_invariant=False`: one full-sequence prefill per admitted request and one left-padded
  batched forward per decode iteration (caches stay per request and are padded into a batch each
  iteration: `rollout.batched`). Log-probs are still exact up to float rounding, but tokens
  may differ by batch.
* `forward_rows=R` (batch-invariant mode, `rollout.speculative.forward_rows`): every forward feeds
  exactly R positions (padded, attention in fixed key blocks; `rollout.verify`), so a forward's
  logits do not depend on how many of its positions are real. That lets `speculation` verify
  up to R - 1 draft tokens per forward exactly: a draft is kept iff it equals the token the
  request's generator draws there, the first mismatch's draw is kept, one draw per emitted
  token, so the tokens and the generator state are those of decoding one token at a time
  (docs/speculative.md).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.rollout.batched import batched_decode
from dynaresize.rollout.engine_base import EngineBase, EngineStats
from dynaresize.rollout.speculative import Speculation, SpeculationSettings
from dynaresize.rollout.verify import (
    crop_rejected,
    fixed_rows_forward,
    fixed_rows_prefill,
    use_row_invariant_attention,
)

__all__ = ["EngineStats", "RolloutEngine", "sample_token"]


@dataclass
class _Running:
    """A request in the running set. Its cache holds every context token except `next_input`."""

    spec: RequestSpec
    generator: torch.Generator
    cache: DynamicCache
    next_input: int
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    @property
    def num_context_tokens(self) -> int:
        return len(self.spec.prompt_tokens) + len(self.generated)


def sample_token(logits: torch.Tensor, temperature: float,
                 generator: torch.Generator) -> tuple[int, float]:
    """Pick one token from last-position `logits` ([vocab], any device) with one uniform draw of
    `generator`; return (token id, its log-prob under softmax(logits / temperature)).
    `temperature == 0` is greedy (the draw is still consumed) with log-probs of the raw logits."""
    logits = logits.detach().to("cpu", torch.float64)
    scaled = logits / temperature if temperature > 0 else logits
    logprobs = torch.log_softmax(scaled, dim=-1)
    u = torch.rand((), dtype=torch.float64, generator=generator)
    if temperature > 0:
        cdf = torch.cumsum(logprobs.exp(), dim=-1)
        token = int(torch.searchsorted(cdf, u * cdf[-1], right=True).clamp_(max=cdf.numel() - 1))
    else:
        token = int(torch.argmax(logits))
    return token, float(logprobs[token])


class RolloutEngine(EngineBase):
    """Continuous-batching, batch-invariant generation for one rollout device (the common
    part: `EngineBase`). A request must fit the model's positions (`max_position_embeddings`:
    prompt + max_new_tokens), as it must fit vLLM's `max_model_len`."""

    context_limit_name = "max_position_embeddings"

    def __init__(self, model: torch.nn.Module, *, eos_token_id: int, device_index: int,
                 max_running: int = 32, batch_invariant: bool = True,
                 torch_device: str = "cpu", whole_prompt_prefill: bool = False,
                 forward_rows: int = 0, speculation: SpeculationSettings | None = None) -> None:
        """Take ownership of `model` (a transformers causal LM accepting `cache=`): it is moved to
        `torch_device`, put in eval mode and frozen. `device_index` is stamped on completions.
        `forward_rows` > 0: fixed-row forwards; `speculation`: draft and verify (needs them)."""
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") \
            else None
        super().__init__(eos_token_id=eos_token_id, device_index=device_index,
                         max_running=max_running, max_context_tokens=positions,
                         vocab_size=getattr(embeddings, "num_embeddings", None))
        if forward_rows < 0 or (forward_rows and not batch_invariant):
            raise ValueError(f"forward_rows = {forward_rows}: must be >= 0, and 0 unless "
                             f"batch_invariant")
        if speculation is not None and not 1 <= speculation.max_draft_tokens < forward_rows:
            raise ValueError(f"speculation needs 1 <= max_draft_tokens < forward_rows, got "
                             f"{speculation.max_draft_tokens} and {forward_rows}")
        self.model = model.to(torch_device).eval().requires_grad_(False)
        # transformers >= 5.20 names the KV cache argument `cache`, earlier 5.x (the 5.19 that
        # vLLM 0.32 pins) `past_key_values`; an unknown name would be ignored silently
        self._cache_arg = ("cache" if "cache" in inspect.signature(model.forward).parameters
                           else "past_key_values")
        self.batch_invariant = batch_invariant
        self.whole_prompt_prefill = whole_prompt_prefill
        self.torch_device = torch.device(torch_device)
        self.forward_rows = forward_rows
        if forward_rows:
            use_row_invariant_attention(self.model)
        self.speculation = Speculation(speculation) if speculation is not None else None
        """Drafting state and acceptance counters (None: speculation off)."""
        self._running: list[_Running] = []

    def _active(self) -> Collection[_Running]:
        return self._running

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy `state_dict` (all keys, strict) into the model in place and set `version`.
        Raises RuntimeError if requests of another version are running (export them first)."""
        self._check_load(version)
        with torch.no_grad():
            self.model.load_state_dict(state_dict, strict=True)
        self.version = version

    def _check_request(self, item: InflightRequest) -> None:
        """`EngineBase._check_request`; a migrated request also needs its generator state."""
        super()._check_request(item)
        if item.generated and item.rng_state is None:
            raise ValueError(f"request {item.spec.key} has generated tokens but no rng_state")

    # ------------------------------------------------------------------ requests out
    def export_inflight(self) -> list[InflightRequest]:
        """Remove every running (first, in admission order) and waiting (FIFO) request and return
        them with their generated prefix, log-probs and generator state; the engine is empty."""
        out = [InflightRequest(spec=r.spec, generated=list(r.generated),
                               logprobs=list(r.logprobs),
                               rng_state=r.generator.get_state().numpy().tobytes())
               for r in self._running]
        if self.speculation is not None:
            for r in self._running:
                self.speculation.pool.remove(r.spec.key)
        out.extend(self._waiting)
        self._running.clear()
        self._waiting.clear()
        return out

    # ------------------------------------------------------------------ decoding
    def step(self) -> list[Completion]:
        """Admit waiting requests up to `max_running` (prefilling their context), then decode one
        token for every running request; return the requests that finished in this iteration."""
        if not self._waiting and not self._running:
            return []
        t0 = time.perf_counter()
        with torch.inference_mode():
            self._admit_waiting(lambda item: self._running.append(self._admit(item)))
            if self.forward_rows:
                logits = [None] * len(self._running)
            elif self.batch_invariant:
                logits = [self._forward(r.cache, [r.next_input]) for r in self._running]
            else:
                logits = batched_decode(self.model, [r.cache for r in self._running],
                                        [r.next_input for r in self._running],
                                        cache_arg=self._cache_arg, device=self.torch_device)
            finished: list[Completion] = []
            still_running: list[_Running] = []
            for req, req_logits in zip(self._running, logits, strict=True):
                done = (self._decode_rows(req) if req_logits is None
                        else self._sample(req, req_logits))
                if done is None:
                    still_running.append(req)
                else:
                    finished.append(done)
            self._running = still_running
        self.stats.num_decode_iterations += 1
        self.stats.busy_s += time.perf_counter() - t0
        return finished

    def _admit(self, item: InflightRequest) -> _Running:
        """Build the running state of `item`: restore its generator and feed its context (prompt +
        generated prefix; token by token if batch-invariant) except the last token, which the next
        decode iteration feeds."""
        spec = item.spec
        generator = torch.Generator(device="cpu")
        if item.rng_state is None:
            generator.manual_seed(spec.seed)
        else:
            generator.set_state(torch.frombuffer(bytearray(item.rng_state), dtype=torch.uint8))
        context = [*spec.prompt_tokens, *item.generated]
        req = _Running(spec=spec, generator=generator, cache=DynamicCache(),
                       next_input=context[-1], generated=list(item.generated),
                       logprobs=list(item.logprobs))
        if self.batch_invariant:
            rest = context[:-1]
            if self.whole_prompt_prefill and len(spec.prompt_tokens) > 2:
                self._forward(req.cache, list(spec.prompt_tokens[:-1]))
                rest = context[len(spec.prompt_tokens) - 1:-1]
            if self.forward_rows:
                fixed_rows_prefill(self.model, req.cache, rest, self.forward_rows,
                                   cache_arg=self._cache_arg, device=self.torch_device)
                rest = []
            for token in rest:
                self._forward(req.cache, [token])
        elif len(context) > 1:
            self._forward(req.cache, context[:-1])
        self.stats.num_prefill_tokens += len(context) - 1
        if self.speculation is not None:
            self.speculation.pool.start(spec.key, spec.prompt_tokens, req.generated)
        return req

    def _decode_rows(self, req: _Running) -> Completion | None:
        """One fixed-row forward of `req`: its next input plus any draft tokens; sample row by
        row while the drafts match (one generator draw per emitted token), keep the cache of the
        emitted tokens only. Return a Completion if `req` stopped."""
        spec, spec_state = req.spec, self.speculation
        drafts = [] if spec_state is None else spec_state.drafts(
            spec.key, num_generated=len(req.generated), max_new_tokens=spec.max_new_tokens,
            num_running=len(self._running))
        logits = fixed_rows_forward(self.model, req.cache, [req.next_input, *drafts],
                                    self.forward_rows, cache_arg=self._cache_arg,
                                    device=self.torch_device)
        start = len(req.generated)
        done = None
        for row in range(len(drafts) + 1):
            done = self._sample(req, logits[row])
            if done is not None or row == len(drafts) or req.next_input != drafts[row]:
                break
        emitted = req.generated[start:]
        if spec_state is not None:
            if drafts:
                accepted = next((i for i, (a, b) in enumerate(zip(emitted, drafts))
                                 if a != b), min(len(emitted), len(drafts)))
                spec_state.stats.record(len(drafts), accepted)
            if done is None:
                spec_state.pool.extend(spec.key, emitted)
            else:
                spec_state.pool.finish(spec.key, len(req.generated))
        crop_rejected(req.cache, len(drafts) + 1, len(emitted))
        return done

    def _forward(self, cache: DynamicCache, tokens: list[int]) -> torch.Tensor:
        """Feed `tokens` (batch 1) after the tokens already in `cache`; return the last logits."""
        start = cache.get_seq_length()
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.torch_device)
        position_ids = torch.arange(start, start + len(tokens), device=self.torch_device)
        out = self.model(input_ids=input_ids, position_ids=position_ids[None], use_cache=True,
                         **{self._cache_arg: cache})
        return out.logits[0, -1]

    def _sample(self, req: _Running, logits: torch.Tensor) -> Completion | None:
        """Sample `req`'s next token from `logits`; return a Completion if `req` stopped."""
        spec = req.spec
        token, logprob = sample_token(logits, spec.temperature, req.generator)
        req.generated.append(token)
        req.logprobs.append(logprob)
        req.next_input = token
        self.stats.num_generated_tokens += 1
        if token == self.eos_token_id:
            reason = "eos"
        elif len(req.generated) >= spec.max_new_tokens:
            reason = "length"
        else:
            return None
        return Completion(spec=spec, tokens=req.generated, logprobs=req.logprobs,
                          finish_reason=reason, device=self.device_index,
                          engine_version=self.version)
