"""The vLLM logits processor of `rollout.engine = "vllm"`: counter-based Gumbel-max sampling
(`dynaresize.rollout.gumbel`) inside vLLM's sampler. Imports vLLM: load it only through
`dynaresize.rollout.vllm_engine`.

A request opts in with `SamplingParams(temperature=0, extra_args={SEED: s, OFFSET: k,
TEMPERATURE: T})`. For its row the processor draws token `t = k + tokens generated in this
submission` as `argmax(logits / T + G(s, t))`, then leaves that token's log-prob under
softmax(logits / T) as the row's only finite logit. vLLM's greedy selection then picks exactly
that token, and with `logprobs_mode = "processed_logits"` reports exactly that log-prob. A
resubmitted request (prompt + generated prefix, `k` = prefix length) so draws the same tokens as
if it had never left its engine. Rows without the opt-in (the engine's batch companion) keep
their logits (greedy).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from dynaresize.rollout.gumbel import OFFSET, SEED, TEMPERATURE, draw_key, gumbel_sample


class GumbelMaxLogitsProcessor(LogitsProcessor):
    """Per-row state: (seed, offset, temperature, the live list of the row's output tokens)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[int, int, float, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it picks the token: applied before vLLM's greedy selection

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output_ids in batch_update.added:
            extra = params.extra_args or {}
            if SEED in extra:
                self.rows[index] = (int(extra[SEED]), int(extra.get(OFFSET, 0)),
                                    float(extra.get(TEMPERATURE, 1.0)), output_ids)
            else:
                self.rows.pop(index, None)
        for a, b, direction in batch_update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if direction == MoveDirectionality.SWAP and row_b is not None:
                self.rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        index = sorted(i for i in self.rows if i < logits.shape[0])
        states = [self.rows[i] for i in index]
        keys = torch.tensor([draw_key(seed, offset + len(out)) for seed, offset, _, out in states],
                            dtype=torch.int64, device=logits.device)
        temps = torch.tensor([temp for _, _, temp, _ in states], dtype=torch.float64,
                             device=logits.device)
        rows = torch.tensor(index, dtype=torch.int64, device=logits.device)
        tokens, logprobs = gumbel_sample(logits[rows], temps, keys)
        picked = torch.full((len(index), logits.shape[1]), float("-inf"), dtype=logits.dtype,
                            device=logits.device)
        picked.scatter_(1, tokens[:, None], logprobs[:, None].to(logits.dtype))
        logits[rows] = picked
        return logits
