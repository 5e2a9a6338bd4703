"""`[rollout.speculative]`, nested in `schema.RolloutConfig`: exact speculative decoding on
the builtin and vLLM engines (docs/speculative.md). No torch/Ray."""

from __future__ import annotations

from dataclasses import dataclass

from dynaresize.config.fields import doc_field as _doc


@dataclass
class SpeculativeConfig:
    """`[rollout.speculative]`: exact speculative decoding (docs/speculative.md)."""

    enabled: bool = _doc("Draft tokens without a model and verify them by equality with the "
                         "token the sampler draws (samples are the same on and off at the same "
                         "forward_rows). Builtin engine: needs forward_rows. vLLM: its "
                         "speculative decoding with these drafters and our sampler; its "
                         "multi-position forwards round differently, so log-probs move by "
                         "~1e-7 and a token only at a near-tie (docs/speculative.md).",
                         default=False)
    forward_rows: int = _doc("Builtin batch-invariant engine: positions every forward feeds "
                             "(padded; attention in fixed key blocks), so logits do not "
                             "depend on how many are verified at once. 0: one-token forwards "
                             "(as before). "
                             "Otherwise >= 4; speculation needs it. A value changes float "
                             "rounding, so samples differ from 0 (not between speculation on "
                             "and off); measured ~1.9x per forward on CPU "
                             "(docs/speculative.md).", default=0)
    max_draft_tokens: int = _doc("Most draft tokens per verify forward (builtin: < "
                                 "forward_rows; vLLM: <= 128).",
                                 default=7)
    drafters: str = _doc("Comma-separated draft sources: 'prefix' (the request's own text), "
                         "'siblings' (its GRPO group's text on the engine), 'history' (earlier "
                         "responses to the same prompt).", default="prefix,siblings,history")
    min_ngram: int = _doc("Shortest context suffix a draft is matched on, tokens (1: a draft "
                          "after any token seen before; measured the most accepted, "
                          "docs/speculative.md).", default=1)
    max_ngram: int = _doc("Longest context suffix a draft is matched on, tokens.", default=4)
    full_batch: int = _doc("Length-aware budget: no drafts while an engine runs this many "
                           "requests, fewer as it fills (0: never full; the builtin engine's "
                           "fixed-row forwards make drafts free). vLLM: set it (e.g. 3); a "
                           "batch's verify forward pays its drafts' compute "
                           "(docs/speculative.md).", default=0)
    long_tokens: int = _doc("Length-aware budget: requests predicted to need fewer tokens than "
                            "this get proportionally fewer drafts (0: no length scaling).",
                            default=0)
    coupled: bool = _doc("vLLM engine: also draft from the target's own next-token "
                         "distributions its verify forwards computed at the same context "
                         "(siblings', earlier steps', rejected drafts' rows), each drawn with "
                         "the request's own sampling noise; token drafts where none is stored. "
                         "Drafts only: the tokens are the same (docs/speculative.md). The "
                         "builtin engine's sampler draws from a generator and drafts tokens.",
                         default=True)
    history_prompts: int = _doc("Prompts whose earlier responses the history drafter keeps "
                                "(LRU).", default=256)
    history_responses: int = _doc("Responses kept per prompt by the history drafter.",
                                  default=16)
