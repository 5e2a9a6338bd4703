"""The vLLM speculation glue without vLLM (`rollout.vllm_speculative`): `draw_rows` puts our
draw for each row's position in vLLM's batch layout, and `VllmDrafting` drafts from vLLM's token
buffer and counts acceptance."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dynaresize.core.types import RequestSpec
from dynaresize.rollout.gumbel import OFFSET, SEED, TEMPERATURE, draw_key, gumbel_sample
from dynaresize.rollout.speculative import SpeculationSettings
from dynaresize.rollout.vllm_speculative import DraftProposer, VllmDrafting, draw_rows


def state(seed: int | None, offset: int = 0, out: int = 0, temp: float = 0.7) -> Any:
    extra = None if seed is None else {SEED: seed, OFFSET: offset, TEMPERATURE: temp}
    return SimpleNamespace(sampling_params=SimpleNamespace(extra_args=extra),
                           output_token_ids=[5] * out)


def test_draw_rows_follows_the_batch_layout_and_positions() -> None:
    requests = {"a": state(7, offset=3, out=2), "comp": state(None), "b": state(9, out=5)}
    batch = SimpleNamespace(num_reqs=3, req_ids=["a", "comp", "b"])
    logits = torch.randn(3 + 2 + 1, 11, generator=torch.Generator().manual_seed(0))
    original = logits.clone()
    draw_rows(batch, requests, logits, [2, 1, 0])  # verify: 3, 2 and 1 rows
    # request a: rows 0-2 are positions 3 + 2 + j; the companion's rows 3-4 are untouched
    for row, (seed, t, temp) in {0: (7, 5, 0.7), 1: (7, 6, 0.7), 2: (7, 7, 0.7),
                                 5: (9, 5, 0.7)}.items():
        token, logprob = gumbel_sample(original[row:row + 1], torch.tensor([temp]),
                                       torch.tensor([draw_key(seed, t)]))
        finite = torch.isfinite(logits[row]).nonzero().flatten().tolist()
        assert finite == [int(token)] and float(logits[row, finite[0]]) == \
            pytest.approx(float(logprob))
    assert torch.equal(logits[3:5], original[3:5])
    plain = original[[0, 3, 5]].clone()  # no drafts: one row per request
    draw_rows(batch, requests, plain, None)
    assert torch.isfinite(plain[0]).sum() == 1 and torch.equal(plain[1], original[3])
    with pytest.raises(RuntimeError, match="rows of logits"):
        draw_rows(batch, requests, original[:4].clone(), [2, 1, 0])


def spec(sample: int, prompt: tuple[int, ...] = (1, 2, 3)) -> RequestSpec:
    return RequestSpec(0, 0, sample, 0, prompt, 20, 11 + sample)


def test_drafting_reads_vllm_tokens_and_counts_acceptance() -> None:
    drafting = VllmDrafting(SpeculationSettings(max_draft_tokens=3, min_ngram=1, max_ngram=2))
    drafting.start("r0", spec(0), [])
    assert drafting.propose("r0", [], [1, 2, 3], 1) == []  # prompt still being read
    seq = [1, 2, 3, 7, 8, 9, 7, 8]
    drafts = drafting.propose("r0", [8], seq, 1)
    assert drafts == [9, 7, 8]  # its own prefix: 7 8 was followed by 9 7 8
    assert drafting.speculation.pool.length(spec(0).key) == len(seq)
    drafting.propose("r0", [9, 7], [*seq, 9, 7], 1)  # one of three accepted
    stats = drafting.speculation.stats
    assert (stats.num_verify_iterations, stats.num_draft_tokens, stats.num_accepted_tokens) == \
        (1, 3, 1)
    drafting.start("r1", spec(1), [])  # a sibling drafts from r0's text
    assert drafting.propose("r1", [9], [1, 2, 3, 9], 2)[:1] == [7]
    drafting.finish("r0", 7)
    drafting.remove("r1")
    assert drafting.propose("r1", [4], [1, 2, 3, 4], 1) == []  # gone: nothing drafted


def test_proposer_caps_drafts_and_skips_foreign_requests() -> None:
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=2))
    proposer = DraftProposer(config)
    assert proposer.propose([[1]], [3], torch.zeros(1, 8, dtype=torch.int64)) == [[]]
    drafting = VllmDrafting(SpeculationSettings(max_draft_tokens=4, min_ngram=1, max_ngram=2))
    drafting.start("r0", spec(0), [])
    proposer.bind(drafting, lambda: ["r0", None])
    tokens = torch.tensor([[1, 2, 3, 7, 8, 9, 7, 8], [0] * 8])
    assert proposer.propose([[8], [4]], [8, 2], tokens) == [[9, 7], []]


def test_the_runs_speculation_summary_adds_every_devices_counts() -> None:
    from dynaresize.rollout.spec_stats import engine_counts, speculation_summary
    from dynaresize.rollout.speculative import Speculation

    spec = Speculation(SpeculationSettings())
    spec.stats.record(4, 3)
    spec.stats.record(2, 0)
    engine = SimpleNamespace(stats=SimpleNamespace(num_generated_tokens=20), speculation=spec)
    plain = SimpleNamespace(stats=SimpleNamespace(num_generated_tokens=10), speculation=None)
    counts = [engine_counts(engine), engine_counts(plain)]
    assert counts[1] == {"generated_tokens": 10, "verify_iterations": 0, "draft_tokens": 0,
                         "accepted_tokens": 0}
    got = speculation_summary(counts)
    # 30 tokens, 3 of them accepted drafts: 27 forwards of a request
    assert got == {"generated_tokens": 30, "verify_iterations": 2, "draft_tokens": 6,
                   "accepted_tokens": 3, "tokens_per_forward": round(30 / 27, 4),
                   "mean_accepted_per_verify": 1.5}
    assert speculation_summary([])["tokens_per_forward"] is None


def test_rows_after_a_rejected_draft_are_not_drawn_and_cannot_be_kept() -> None:
    requests = {"a": state(7, out=2), "comp": state(None), "b": state(9, out=5)}
    batch = SimpleNamespace(num_reqs=3, req_ids=["a", "comp", "b"])
    logits = torch.randn(4 + 1 + 3, 11, generator=torch.Generator().manual_seed(1))
    eager = logits.clone()
    draw_rows(batch, requests, eager, [3, 0, 2])  # every row drawn
    drawn = eager.argmax(-1).tolist()
    # request a: its first two drafts are the draws, its third is not; b's first is wrong
    drafts_a = [drawn[0], drawn[1], (drawn[2] + 3) % 11]
    drafts_b = [(drawn[5] + 1) % 11, drawn[6]]
    lazy = logits.clone()
    draw_rows(batch, requests, lazy, [3, 0, 2], None, [*drafts_a, *drafts_b])
    for row in (0, 1, 2, 5):  # drawn: up to and including the first rejected draft's row
        assert torch.equal(lazy[row], eager[row])
    assert torch.equal(lazy[4], logits[4])  # the companion untouched
    for row, draft in ((3, None), (6, drafts_b[1]), (7, None)):  # after it: unread, refused
        finite = torch.isfinite(lazy[row]).nonzero().flatten().tolist()
        assert len(finite) == 1 and finite[0] != draft
    every = logits.clone()  # all drafts kept: every row drawn, the bonus row too
    draw_rows(batch, requests, every, [3, 0, 2], None, [*drawn[0:3], *drawn[5:7]])
    assert torch.equal(every, eager)
