"""What one rank holds of a step's exact-reduction gradients and how they add up (`train.exact`,
the module docstring's points 1-2): `HeldGradients` (the per-micro-batch gradients and their
fold), the sum in index order (`ordered_sum`), the float64 norm and the clip. Local: no
distributed calls."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class HeldGradients:
    """One rank's not yet combined micro-batch gradients of one step. What
    `FSDPTrainer.take_holdings` returns and `put_holdings` takes (e.g. across the trainer
    rebuild of a resize in the middle of a step). Valid only for parameters at
    `optimizer_step` with the same `layout`."""

    step: int
    optimizer_step: int
    """AdamW steps behind the parameters the gradients were taken at."""
    layout: str
    """Digest of the parameter names and shapes."""
    grads: dict[int, torch.Tensor] = field(default_factory=dict)
    """Global micro-batch index -> flat fp32 gradient of its loss sum [P]; with `folded`,
    index 0 holds the fold."""
    stats: dict[int, torch.Tensor] = field(default_factory=dict)
    """Global micro-batch index -> float64 [NUM_STATS] (`forward.STAT_KEYS`), every held
    index (folded ones too)."""
    compute_s: float = 0.0
    """Seconds this rank spent computing them."""
    folded: int = 0
    """> 0: indices 0 .. folded - 1 are held here as one tensor, grads[0] = the left fold
    g_0 + g_1 + ... + g_{folded-1}: the first adds of the step's sum in index order, so the
    combine starts from it and gets the same bits (`fold`)."""

    def indices(self) -> list[int]:
        """Every micro-batch index held here, folded or not."""
        return sorted(set(self.grads) | set(range(self.folded)))

    def fold(self) -> None:
        """Add held indices into the fold while they continue it (index 0 starts it): the
        step's sum is a left fold in index order, so only its prefix can be summed before
        the combine. One [P] tensor then holds any number of in-order micro-batches."""
        if self.folded == 0 and 0 in self.grads:
            self.folded = 1
        while self.folded and self.folded in self.grads:
            self.grads[0] += self.grads.pop(self.folded)
            self.folded += 1


def ordered_sum(rows: torch.Tensor) -> torch.Tensor:
    """rows[0] + rows[1] + ... in index order (elementwise adds: layout-invariant)."""
    out = rows[0].clone()
    for row in rows[1:]:
        out += row
    return out


NORM_CHUNK = 2**20
"""Elements per float64 piece of `float64_norm` (8 MiB)."""


def float64_norm(vector: torch.Tensor) -> float:
    """The 2-norm of a 1-D float32 `vector` accumulated in float64, without a float64 copy of
    the whole vector (torch's `vector_norm(dtype=float64)` makes one: 1 GiB for SmolLM2-135M's
    gradient, on every training rank at once): each `NORM_CHUNK` piece's float64 sum of
    squares, the pieces added in index order. A fixed order of fixed operations, so the same
    bits on every rank for the same vector (the exact path's full gradient is) at the same
    torch thread count, which the exact path requires anyway (a piece's sum may round
    otherwise at another). Not `vector_norm`'s bits: ~1e-16 relative apart."""
    total = 0.0
    for start in range(0, vector.numel(), NORM_CHUNK):
        piece = vector[start:start + NORM_CHUNK].to(torch.float64)
        total += float(piece.square_().sum())
    return math.sqrt(total)


def scale_and_clip_(grad: torch.Tensor, global_num_tokens: int, max_norm: float) -> float:
    """In place: grad / global_num_tokens (the loss's normaliser, `forward.loss_denominator`),
    then clipped to `max_norm` (0: no clipping) like
    `torch.nn.utils.clip_grad_norm_` (coefficient max_norm / (norm + 1e-6) if below 1).
    Returns the norm before clipping (float64 accumulation: same bits on every rank)."""
    grad.div_(global_num_tokens)
    norm = float64_norm(grad)
    if max_norm > 0:
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            grad.mul_(coef)
    return norm
