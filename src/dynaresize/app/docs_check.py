"""The docs check: what README.md and docs/*.md cite in backticks must be true of the code.

    python -m dynaresize.app.docs_check [REPO_ROOT]     # prints FILE:LINE: `cited`: problem

Each backtick span is classified by its shape and checked against the code (read with `ast`,
not imported: `docs_index`) and the config schema:

- `dynaresize ...` command lines: `docs_commands` (parsed; README's also run, `--dry-run`);
- `--flag`: an option of the `dynaresize` command, a bench script or a scripts/*.sh;
- `[section]`, `[[faults.kill]]`, `section.key`, `section.table.key`: a config key (or table);
  `key = value` in the span: a value the key accepts; "`key` = value", "(`key`, value)",
  "`key` (default value)" around it: the key's default (`docs_config`);
- `path/to/file.py`, `name.md`, `out.json`: a repository file, or a name the code uses (run
  directory files such as `metrics.jsonl` are string literals in the code);
- `module.path.name`, `Class.member`, `func(...)`: resolve in src/dynaresize (module suffixes
  count: `resize.planner.plan_resize`), or in an installed package (`torch.Generator`);
- `CamelCase`, `snake_case` (and `_private`) names, `ALL_CAPS`: defined or used in the code
  (identifiers or string literals: record keys, event kinds), a config key name or in a script;
- CamelCase names and `.py` paths in unlabelled code blocks (diagrams) likewise;
- markdown links `[text](target.md#anchor)`: the target file exists (relative to the doc) and
  has the anchor: a heading's GitHub id or an `<a id="anchor"></a>` (`docs_anchors`).

Plain lowercase words (`hysteresis`, `rollout`), maths and prose are not checked. Terms that
look like code but are not are listed, each with its reason, in `NOT_CODE`.
"""

from __future__ import annotations

import builtins
import re
import sys
from collections import Counter
from pathlib import Path

from dynaresize.app.docs_anchors import markdown_anchors
from dynaresize.app.docs_citations import citations
from dynaresize.app.docs_config import ConfigCitations
from dynaresize.app.docs_index import (  # noqa: F401  (Citation, Finding re-exported)
    Citation,
    CodeIndex,
    Finding,
    build_index,
    config_field_names,
    config_lookup,
    is_external,
)

NOT_CODE: dict[str, str] = {
    "SIGKILL": "a POSIX signal",
    "ActorDiedError": "Ray's exception for a call on a dead actor (prose)",
    "SmolLM2": "the model's name",
    "MiB": "a unit",
    "LlamaForCausalLM": "a transformers class the model loads as (not named in our code)",
    "Queue": "asyncio.Queue, in prose",
    "Handle._run": "asyncio's internals, in prose",
    "call_soon_threadsafe": "an asyncio loop method, in prose",
    "split_group": "torch.distributed's function, which the design avoids with gloo",
    "--node-ip-address": "an option of `ray start`",
    "chain_sum": "a reasoning-gym generator (a task.generator value)",
    "basic_arithmetic": "a reasoning-gym generator (a task.generator value)",
    "gsm_symbolic": "a reasoning-gym generator (a task.generator value)",
    "leg_counting": "a reasoning-gym generator (a task.generator value)",
}
"""Code-shaped terms that name no code of ours, each with the reason it is allowed."""

SRC = "src/dynaresize/"
FILE_SUFFIXES = (".py", ".md", ".toml", ".sh", ".json", ".jsonl", ".png", ".txt", ".pt",
                 ".csv", ".parquet", ".gguf", ".yaml", ".cfg", ".safetensors", ".bin", ".log")
PLACEHOLDER_PATH = re.compile(r"[<>*…$~{}]|^runs/|^/|^\.venv/|://|\.\.\.|(^|/)[A-Z][A-Z0-9_]+(/|$)"
                              r"|-[A-Z]$")
"""A path that is a pattern, not a file: `out/<policy>/`, `RUN_DIR/export/version-V`, a URL, a
run directory (`runs/...`), an absolute path."""
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
NAME = re.compile(r"^[A-Za-z_]\w*$")
CALL = re.compile(r"^([A-Za-z_][\w.]*)\(.*\)$")
ASSIGN = re.compile(r"^([A-Za-z_][\w.]*)\s*=\s*(.+)$")
MATH = re.compile(r"[A-Za-z]_\{?\w{1,3}\}?")
"""`B_k`, `g_m`: a symbol with a subscript, not a name."""
BUILTINS = frozenset(dir(builtins))
EVENT_PREFIXES = ("resize",)
"""events.jsonl kinds are `resize.<op>`: `resize.join_group` names the op `join_group`."""


class Checker:
    """Checks citations against one repository's code, config schema and files."""

    def __init__(self, root: Path, index: CodeIndex | None = None) -> None:
        self.root = root
        self.index = index or build_index(root)
        self.key_names = config_field_names()
        self.counts: Counter[str] = Counter()
        self.config = ConfigCitations(self.counts)
        """Config keys, tables, values and defaults (`docs_config`; counts into `counts`)."""
        self.anchors: dict[Path, set[str]] = {}

    def check(self, c: Citation) -> list[Finding]:
        """The findings of one citation (none if it holds or is not checked)."""
        if c.kind == "diagram":
            return self._code_name(c, c.text)
        if c.kind == "link":
            return self._link(c)
        if c.kind == "code" or c.text in NOT_CODE:
            return []
        s = c.text
        if s.startswith(("dynaresize ", "bash ", "python ")):
            return []  # command lines: docs_commands
        if s.startswith("--"):
            return self._flag(c, s.split()[0].split("=")[0])
        if re.fullmatch(r"\[\[?[\w.]+\]\]?", s):
            return self.config.key(c, s.strip("[]"), table=True)
        if " " not in s and ("/" in s or s.endswith(FILE_SUFFIXES)) and "(" not in s:
            return self._file(c, s)
        m = ASSIGN.match(s)
        if m and "==" not in s and DOTTED.match(m.group(1)):
            if m.group(1).split(".")[0] not in self.config.sections:
                return self._code_name(c, m.group(1))
            return self.config.value(c, m.group(1), m.group(2))
        m = CALL.match(s)
        if m:  # `func(args)`, `obj.method(args)`: the function's name
            return self._code_name(c, m.group(1).rsplit(".", 1)[-1])
        if DOTTED.match(s) or NAME.match(s):
            return self._code_name(c, s)
        return []

    def _link(self, c: Citation) -> list[Finding]:
        """A markdown link: its file exists (relative to the doc; none: the doc itself) and
        a `#anchor` in it is a heading's GitHub id or an `<a id=...>` of that file."""
        self.counts["link"] += 1
        target, _, anchor = c.text.partition("#")
        file = self.root / Path(c.path).parent / target if target else self.root / c.path
        if not file.exists():
            return self._finding(c, "the link's target does not exist (relative to the doc)")
        if not anchor or file.suffix != ".md" or anchor in self._anchors(file):
            return []
        return self._finding(c, f"no anchor #{anchor} in {target or c.path} (a heading's "
                                "GitHub id, or <a id=\"...\"></a> before the heading; GitHub "
                                "ignores {#id})")

    def _anchors(self, file: Path) -> set[str]:
        if file not in self.anchors:
            self.anchors[file] = markdown_anchors(file.read_text(encoding="utf-8"))
        return self.anchors[file]

    def _finding(self, c: Citation, problem: str, cited: str | None = None) -> list[Finding]:
        return [Finding(c.path, c.line, cited or c.text, problem)]

    def _flag(self, c: Citation, flag: str) -> list[Finding]:
        from dynaresize.app.docs_commands import all_options

        self.counts["flag"] += 1
        if flag in all_options() or flag in self.index.strings or \
                re.search(re.escape(flag) + r"\b", self.index.script_text):
            return []
        return self._finding(c, "no such option of `dynaresize`, a bench script or "
                                "scripts/*.sh", flag)

    def _file(self, c: Citation, path: str) -> list[Finding]:
        self.counts["file"] += 1
        if PLACEHOLDER_PATH.search(path):
            return []
        path = path.removeprefix("./")
        found = self.index.matching_files(path)
        exact = path in found or SRC + path in found
        if path.endswith(".py") and not exact and len(found) > 1:
            return self._finding(c, "ambiguous: give its folder (" + ", ".join(
                f.removeprefix(SRC) for f in found) + ")")
        if found or Path(path).name in self.index.strings:
            return []
        return self._finding(c, "no such file in the repository (nor a file name the code "
                                "writes or reads)")

    def _code_name(self, c: Citation, name: str) -> list[Finding]:
        ix = self.index
        if name in NOT_CODE:
            return []
        if name.endswith(".py"):
            return self._file(c, name)
        if "." in name:
            first = name.split(".")[0]
            if first in self.config.sections and config_lookup(name)[0]:
                return self.config.key(c, name)
            self.counts["code path"] += 1
            bare = name.removeprefix("cfg.")
            if ix.resolve(name) or is_external(name) or config_lookup(bare)[0] \
                    or first in BUILTINS or (first in EVENT_PREFIXES and
                                             self._known(name.split(".", 1)[1])):
                return []
            also = (f"; nor a config key (no key {name!r} in config/schema.py)"
                    if first in self.config.sections else "")
            return self._finding(c, "does not resolve in src/dynaresize (module, class or "
                                    f"function renamed or gone?){also}")
        if MATH.fullmatch(name):
            return []
        if re.fullmatch(r"_?[A-Z]\w*[a-z]\w*", name) and name not in BUILTINS:
            self.counts["class name"] += 1
            if ix.defines(name) or name in ix.identifiers:
                return []
            return self._finding(c, "no class or name of that name in src/dynaresize")
        if "_" in name.strip("_") or name.startswith("_"):
            self.counts["name"] += 1
            if self._known(name):
                return []
            return self._finding(c, "no function, attribute, record key or config key of that "
                                    "name in src/dynaresize")
        return []


    def _known(self, name: str) -> bool:
        """Defined or used in the code, a config key name, or in a script."""
        ix = self.index
        return (name in ix.identifiers or name in ix.strings or name in self.key_names
                or ix.defines(name)
                or re.search(r"\b" + re.escape(name) + r"\b", ix.script_text) is not None)


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def check_docs(root: Path, run_commands: bool = True) -> tuple[list[Finding], Counter[str]]:
    """Every finding in README.md and docs/*.md, and how many citations of each kind were
    checked."""
    from dynaresize.app.docs_commands import check_commands

    checker = Checker(root)
    findings: list[Finding] = []
    for path in doc_files(root):
        rel = path.relative_to(root).as_posix()
        cites = citations(rel, path.read_text(encoding="utf-8"))
        for c in cites:
            findings += checker.check(c)
        findings += check_commands(cites, root, checker.counts,
                                   run=run_commands and rel == "README.md")
    return findings, checker.counts


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0] if args else ".").resolve()
    findings, counts = check_docs(root)
    for f in findings:
        print(f)
    if findings:
        print("fix the doc (or the code); a term that only looks like code goes into NOT_CODE "
              "in src/dynaresize/app/docs_check.py, with its reason", file=sys.stderr)
    total = sum(counts.values())
    print(f"docs check: {total} citations checked ("
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f"); "
          f"{len(findings)} problem(s)", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
