"""Coupled drafts (`rollout.coupled`): drawn from stored target distributions with the
request's own noise, so a draft from the right distribution is the token the sampler draws."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from dynaresize.core.types import RequestSpec
from dynaresize.rollout.coupled import DistributionStore, coupled_drafts, top_logprobs
from dynaresize.rollout.gumbel import (
    OFFSET,
    SEED,
    TEMPERATURE,
    draw_key,
    gumbel_at,
    gumbel_sample,
    uniforms,
)
from dynaresize.rollout.speculative import SpeculationSettings
from dynaresize.rollout.vllm_speculative import REQUEST, VllmDrafting, draw_rows

VOCAB = 40


def observed(logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    ids, logprobs = top_logprobs(logits[None], k=VOCAB)
    return ids[0], logprobs[0]


def test_noise_of_some_tokens_is_the_full_rows_noise() -> None:
    ids = np.array([3, 0, 39, 17])
    full = -torch.log(-torch.log(uniforms(torch.tensor([draw_key(5, 9)]), VOCAB)[0]))
    assert np.allclose(gumbel_at(5, 9, ids), full.numpy()[ids], rtol=0, atol=1e-12)


def test_store_finds_the_longest_seen_suffix_per_prompt() -> None:
    store = DistributionStore(1, 3, mix=1)
    a = (np.array([1]), np.array([0.0]))
    b = (np.array([2]), np.array([0.0]))
    store.observe((9,), [4, 5, 6], a)  # keys (6), (5 6), (4 5 6)
    store.observe((9,), [7, 6], b)  # (6) and (7 6) now b
    def found(context: list[int]) -> int | None:
        got = store.lookup((9,), context)
        return None if got is None else int(got[0][0])

    assert found([0, 4, 5, 6]) == 1
    assert found([1, 5, 6]) == 1  # (5 6)
    assert found([3, 6]) == 2  # only (6) matches: the most recent
    assert found([5]) is None
    assert store.size == 4


def test_store_falls_back_to_what_any_prompt_saw() -> None:
    store = DistributionStore(1, 3)
    store.observe((9,), [4, 5, 6], (np.array([1]), np.array([0.0])))
    store.observe((8,), [7, 6], (np.array([2]), np.array([0.0])))
    got = store.lookup((7,), [4, 5, 6])  # a prompt that saw nothing: (4 5 6) from prompt 9
    assert got is not None and got[0].tolist() == [1]
    got = store.lookup((8,), [4, 5, 6])  # prompt 8's own (6) first, though shorter
    assert got is not None and got[0].tolist() == [2]
    assert DistributionStore(1, 3, shared_entries=0).lookup((7,), [6]) is None


def test_store_averages_the_last_observations_of_a_context() -> None:
    store = DistributionStore(1, 1, mix=2)
    half = np.log(np.array([0.5, 0.5]))
    store.observe((9,), [6], (np.array([1, 2]), half))
    store.observe((9,), [6], (np.array([2, 3]), np.log(np.array([0.9, 0.1]))))
    ids, logprobs = store.lookup((9,), [6])  # type: ignore[misc]
    assert ids.tolist() == [1, 2, 3]
    assert np.allclose(np.exp(logprobs), [0.25, 0.7, 0.05])
    store.observe((9,), [6], (np.array([4]), np.array([0.0])))  # the first one goes
    ids, logprobs = store.lookup((9,), [6])  # type: ignore[misc]
    assert ids.tolist() == [2, 3, 4] and np.allclose(np.exp(logprobs), [0.45, 0.05, 0.5])


def test_store_drops_the_least_recently_used_prompt_past_its_bound() -> None:
    store = DistributionStore(1, 2, max_entries=5)
    one = (np.array([1]), np.array([0.0]))
    store.observe((1,), [1, 2], one)
    store.observe((2,), [1, 2], one)
    store.observe((1,), [3, 4], one)  # prompt 1 used last: prompt 2 goes at 6 entries
    assert store.size == 4
    assert store.lookup((1,), [1, 2]) is not None
    shared = DistributionStore(1, 1, shared_entries=2)
    for last in (1, 2, 3):
        shared.observe((last,), [last], one)  # each prompt its own; (1) leaves the shared
    assert shared.lookup((5,), [1]) is None and shared.lookup((5,), [3]) is not None


def test_drafts_from_the_true_distribution_are_the_sampled_tokens() -> None:
    """A model whose next token depends on the last one only: with its distributions stored,
    the coupled drafts of any seed are exactly what the sampler draws, at temperature 1."""
    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(1)) * 1.5
    store = DistributionStore(1, 1)
    for last in range(VOCAB):
        store.observe((0,), [last], observed(table[last]))
    for seed in range(5):
        drawn, context = [], [7]
        for t in range(10, 17):
            token, _ = gumbel_sample(table[context[-1]][None], torch.tensor([1.0]),
                                     torch.tensor([draw_key(seed, t)]))
            drawn.append(int(token))
            context.append(int(token))
        assert coupled_drafts(store, (0,), [7], seed=seed, first_t=10, temperature=1.0,
                              limit=7) == drawn
        # another prompt (nothing of its own stored) drafts from what prompt 0 saw
        assert coupled_drafts(store, (1,), [7], seed=seed, first_t=10, temperature=1.0,
                              limit=7) == drawn
    alone = DistributionStore(1, 1, shared_entries=0)
    alone.observe((0,), [7], observed(table[7]))
    assert coupled_drafts(alone, (1,), [7], seed=0, first_t=10, temperature=1.0,
                          limit=7) == []  # nothing stored for that prompt


def test_draw_rows_reports_each_requests_rows_before_drawing() -> None:
    extra = {SEED: 7, OFFSET: 0, TEMPERATURE: 1.0, REQUEST: "a"}
    requests = {"a": SimpleNamespace(sampling_params=SimpleNamespace(extra_args=extra),
                                     output_token_ids=[])}
    batch = SimpleNamespace(num_reqs=1, req_ids=["a"])
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(2))
    seen: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    draw_rows(batch, requests, logits.clone(), [2], lambda rid, obs: seen.setdefault(rid, obs))
    ids, logprobs = seen["a"]
    assert ids.shape[0] == 3 and np.array_equal(ids[:, 0], logits.argmax(-1).numpy())
    assert np.allclose(logprobs[:, 0], torch.log_softmax(logits, -1).max(-1).values.numpy())


def rows(*logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    found = [observed(x) for x in logits]
    return np.stack([f[0] for f in found]), np.stack([f[1] for f in found])


def test_vllm_drafting_stores_every_verified_row_and_drafts_from_it() -> None:
    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(3))
    drafting = VllmDrafting(SpeculationSettings(max_draft_tokens=3, min_ngram=1, max_ngram=1,
                                                coupled=True))
    prompt = (1, 2)
    drafting.start("a", RequestSpec(0, 0, 0, 0, prompt, 20, 11, 1.0), [])
    drafting.observe("a", rows(table[2]))  # the prompt's forward: after (1 2)
    assert drafting.propose("a", [5], [1, 2, 5], 1) == []  # none stored after (5)
    drafting.observe("a", rows(table[5]))
    drafts = drafting.propose("a", [2], [1, 2, 5, 2], 1)
    # after (2): the draw of generated token 2 from the distribution stored there
    token, _ = gumbel_sample(table[2][None], torch.tensor([1.0]),
                             torch.tensor([draw_key(11, 2)]))
    assert drafts[:1] == [int(token)]
    drafting.observe("a", rows(table[2], *(table[d] for d in drafts)))
    wrong = (drafts[0] + 1) % VOCAB
    drafting.propose("a", [wrong], [1, 2, 5, 2, wrong], 1)  # the draft rejected
    store = drafting.store
    assert store is not None
    for d in drafts:  # every verified row is stored under its context, rejected ones' too
        found = store.lookup(prompt, [d])
        assert found is not None and np.array_equal(found[0], observed(table[d])[0])
    assert drafting.speculation.stats.num_draft_tokens == len(drafts)
