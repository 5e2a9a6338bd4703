"""What live-run tests compare between two run directories (shared by the integration tests)."""

from __future__ import annotations

from pathlib import Path

from dynaresize.core.rundir import read_jsonl


def sample_view(path: Path) -> dict[tuple[int, int, int], tuple[int, str, int]]:
    """(step, prompt, sample) → (version, tokens_sha256, response_tokens); each sample once."""
    records = read_jsonl(path / "samples.jsonl")
    view = {(s["step"], s["prompt"], s["sample"]): (s["version"], s["tokens_sha256"],
                                                    s["response_tokens"]) for s in records}
    assert len(view) == len(records), "a sample was recorded twice"
    return view


def max_param_diff(a: Path, b: Path) -> float:
    """Max |Δ| over the final weights (model.pt) of two runs."""
    import torch

    sa, sb = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    assert sa.keys() == sb.keys()
    return max(float((sa[k].double() - sb[k].double()).abs().max()) for k in sa)
