"""The collective half of the exact combine (`train.exact`, point 2): the checks every rank
makes on the step's holdings, and the sum of the held gradients in index order, all-reduced or
broadcast in bounded blocks. Every function here gives the same bits on every rank for every
layout: each element of an all-reduced buffer has exactly one non-zero addend.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["BROADCAST_CHUNK", "COMBINE_BUDGET_BYTES", "add_broadcast", "check_holdings",
           "sum_rows"]

COMBINE_BUDGET_BYTES = 256 * 2**20
"""The combine all-reduces the held gradients in blocks of rows of at most this many bytes
(one row at least): the buffer was [M, P] fp32, M micro-batches, 8.6 GB for 16 micro-batches of
SmolLM2-135M on every training rank; now one [P] row (540 MB) for it."""

BROADCAST_CHUNK = 16 * 2**20
"""Elements per broadcast when a one-row block is added to the sum (64 MiB of fp32)."""


def sum_rows(rows: list[int], held: dict[int, torch.Tensor], num_params: int,
             group: dist.ProcessGroup, device: torch.device,
             holders: dict[int, int] | None = None) -> torch.Tensor:
    """g_rows[0] + g_rows[1] + ... in index order, all-reduced in blocks of at most
    `COMBINE_BUDGET_BYTES` (one row at least): the same adds in the same order as one
    [M, P] buffer (bitwise), in a bounded buffer whatever the number of micro-batches.
    Consumes `held` (this rank's rows, index -> [P]): a held row is popped as it is added, so
    the held gradients are not copied and their memory goes as the sum proceeds. A one-row
    block (a model above the budget) is broadcast from its holder (`holders`: row -> group
    rank) instead: an all-reduce of it adds only zeros to the holder's value, so the bits
    are the same, without a [P] buffer of zeros on every other rank; the first row becomes
    the sum, the next ones are added to it in `BROADCAST_CHUNK` pieces."""
    block = max(1, COMBINE_BUDGET_BYTES // (4 * num_params))
    total: torch.Tensor | None = None
    for start in range(0, len(rows), block):
        part = rows[start:start + block]
        if len(part) == 1 and holders is not None:
            total = add_broadcast(total, held.pop(part[0], None), holders[part[0]],
                                  num_params, group, device)
            continue
        if len(part) == 1:  # the row itself is the buffer: x + 0 + ... + 0 == x
            grads = held.pop(part[0], None)
            if grads is None:
                grads = torch.zeros(num_params, dtype=torch.float32, device=device)
            grads = grads.unsqueeze(0)
        else:
            grads = torch.zeros(len(part), num_params, dtype=torch.float32, device=device)
            for i, m in enumerate(part):
                if m in held:
                    grads[i] = held.pop(m)
        dist.all_reduce(grads, group=group)  # one non-zero addend per element
        for row in grads:
            if total is None:
                total = row.clone() if len(part) > 1 else row
            else:
                total += row
        del grads, row  # a buffer goes before the next one is made
    assert total is not None
    return total


def add_broadcast(total: torch.Tensor | None, row: torch.Tensor | None, holder: int,
                  num_params: int, group: dist.ProcessGroup, device: torch.device
                  ) -> torch.Tensor:
    """`total` + the row group rank `holder` holds (`row` there, None elsewhere), on every
    rank; the row itself (holder) or a received copy when `total` is None."""
    if total is None:
        if row is None:
            row = torch.empty(num_params, dtype=torch.float32, device=device)
        dist.broadcast(row, group=group, group_src=holder)
        return row
    buf = None if row is not None else torch.empty(
        min(BROADCAST_CHUNK, num_params), dtype=torch.float32, device=device)
    for a in range(0, num_params, BROADCAST_CHUNK):
        b = min(a + BROADCAST_CHUNK, num_params)
        piece = row[a:b] if row is not None else buf[:b - a]  # type: ignore[index]
        dist.broadcast(piece, group=group, group_src=holder)
        total[a:b] += piece
    return total


def check_holdings(flags: list[int], step: int, m_count: int, gaps_ok: bool = False) -> None:
    """Raise (on every rank alike: `flags` is all-reduced) unless every micro-batch index
    below `m_count` is held by exactly one rank (`gaps_ok`: or by none) and every holding is
    of `step` at the current parameters. `flags`: per-index holder counts, then the count of
    indices >= m_count, of ranks on another step, of ranks at other parameters (the layout
    `ExactReducer.combine` fills)."""
    counts = flags[:m_count]
    missing = [] if gaps_ok else [m for m, c in enumerate(counts) if c == 0]
    twice = {m: c for m, c in enumerate(counts) if c > 1}
    problems = []
    if missing:
        problems.append(f"micro-batch(es) {missing[:10]} held by no rank")
    if twice:
        problems.append("micro-batch(es) held by several ranks (index: ranks) "
                        f"{dict(list(twice.items())[:10])}")
    if flags[m_count]:
        problems.append(f"{flags[m_count]} held index(es) >= num_micro_batches = {m_count}")
    if flags[m_count + 1]:
        problems.append(f"{flags[m_count + 1]} rank(s) hold gradients of another step")
    if flags[m_count + 2]:
        problems.append(f"{flags[m_count + 2]} rank(s) hold gradients taken at other "
                        "parameters (another optimizer step)")
    if not any(counts):
        problems.append("no micro-batch is held")
    if problems:
        raise ValueError(f"finish of step {step}: " + "; ".join(problems)
                         + " (holdings are left as they were)")
