"""GRPO / PPO-clip algorithm code: pure tensor functions, no distributed calls.

- `group_advantages`: rewards in (prompt, sample) order → group-normalised advantages.
- `token_logprobs`: logits [B, L, V] and targets [B, L] → log-probs of the targets [B, L].
- `ppo_clip_loss_sum`: per-token log-probs, behaviour log-probs, per-token advantages and a
  response-token mask → the SUM over masked tokens of the clipped surrogate loss. Summing (not
  averaging) lets the trainer divide a global batch's loss once by its global token count,
  whatever the micro-batching or the number of ranks.
- `clipped_token_count`: how many masked tokens have a ratio outside [1 - eps, 1 + eps].
- `kl_penalty_sum`: SUM over masked tokens of the k3 estimator of KL(policy || reference).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dynaresize.core.advantages import group_advantages as flat_group_advantages


def group_advantages(rewards: Sequence[float] | torch.Tensor, group_size: int | None = None,
                     eps: float = 1e-6) -> list[float] | torch.Tensor:
    """GRPO advantages (r - mean_group) / (std_group + eps), std unbiased; a group whose rewards
    are all equal gets exactly 0.

    `rewards` is either a flat sequence of floats in (prompt, sample) order with `group_size`
    samples per prompt (returns a list of floats, pure Python: usable without a tensor), or a
    tensor [num_prompts, group_size] (returns a float32 tensor of that shape).
    """
    if isinstance(rewards, torch.Tensor):
        if rewards.dim() != 2 or rewards.shape[1] < 2:
            raise ValueError(f"rewards tensor must be [num_prompts, group_size >= 2], "
                             f"got shape {tuple(rewards.shape)}")
        r = rewards.to(torch.float64)
        mean = r.mean(dim=1, keepdim=True)
        std = r.std(dim=1, keepdim=True)
        adv = (r - mean) / (std + eps)
        equal = (r == r[:, :1]).all(dim=1, keepdim=True)
        return torch.where(equal, torch.zeros_like(adv), adv).to(torch.float32)
    if group_size is None:
        raise ValueError("group_size is required for a flat reward list")
    return flat_group_advantages(rewards, group_size, eps)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probability of `targets` [B, L] under `logits` [B, L, V], computed in float32."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets "
                         f"{tuple(targets.shape)}")
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def importance_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor,
                     sequence: bool = False) -> torch.Tensor:
    """[B, L] ratios pi / pi_old: per token, or (`sequence`, GSPO) each row's
    exp(mean over its masked tokens of the log-ratio), broadcast over the row."""
    if not sequence:
        return torch.exp(logprobs - old_logprobs)
    m = mask.bool()
    delta = torch.where(m, logprobs - old_logprobs, torch.zeros_like(logprobs))
    lengths = m.sum(dim=-1, keepdim=True).clamp(min=1)
    return torch.exp(delta.sum(dim=-1, keepdim=True) / lengths).expand_as(logprobs)


def _masked_sum(values: torch.Tensor, mask: torch.Tensor,
                weights: torch.Tensor | None) -> torch.Tensor:
    """SUM over `mask`ed entries of values (x `weights` [B, 1] per row when given)."""
    if weights is not None:
        values = values * weights
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum()


def ppo_clip_loss_sum(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                      advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float,
                      clip_high: float | None = None, weights: torch.Tensor | None = None,
                      sequence_ratio: bool = False) -> torch.Tensor:
    """SUM over `mask`ed tokens of w·max(-A·ratio, -A·clip(ratio, 1 - eps, 1 + eps_high));
    all inputs [B, L], `weights` [B, 1] (None: 1), `clip_high` None: `clip_eps`,
    `sequence_ratio`: GSPO's ratio (`importance_ratio`)."""
    high = clip_eps if clip_high is None else clip_high
    ratio = importance_ratio(logprobs, old_logprobs, mask, sequence_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)
    per_token = torch.maximum(unclipped, clipped)
    return _masked_sum(per_token, mask, weights)


def clipped_token_count(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                        mask: torch.Tensor, clip_eps: float, clip_high: float | None = None,
                        sequence_ratio: bool = False) -> torch.Tensor:
    """Number of masked tokens whose ratio lies outside [1 - eps, 1 + eps_high] (no
    gradient)."""
    with torch.no_grad():
        ratio = importance_ratio(logprobs, old_logprobs, mask, sequence_ratio)
        if clip_high is None or clip_high == clip_eps:
            outside = (ratio - 1.0).abs() > clip_eps
        else:
            outside = (ratio < 1.0 - clip_eps) | (ratio > 1.0 + clip_high)
        return (outside & mask.bool()).sum()


def kl_penalty_sum(logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                   mask: torch.Tensor, estimator: str = "k3",
                   weights: torch.Tensor | None = None) -> torch.Tensor:
    """SUM over masked tokens of an estimator of KL(policy || reference), with
    d = ref - logp: k1 = -d, k2 = d^2 / 2, k3 = exp(d) - d - 1 (>= 0, unbiased)."""
    delta = ref_logprobs - logprobs
    if estimator == "k3":
        kl = torch.exp(delta) - delta - 1.0
    elif estimator == "k2":
        kl = 0.5 * delta * delta
    elif estimator == "k1":
        kl = -delta
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; allowed: k1, k2, k3")
    return _masked_sum(kl, mask, weights)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy [B, L] of each position's distribution under `logits` [B, L, V] (float32)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(torch.exp(logp) * logp).sum(dim=-1)
