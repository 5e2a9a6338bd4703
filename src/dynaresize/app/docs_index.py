"""What the docs check (`docs_check`) resolves citations against, built without importing the
code it describes: the package's modules, classes, functions and attributes (read with `ast`),
every identifier and string literal in it, the repository's files, and the config schema.

Pure apart from reading files; importing the config schema is cheap (no torch)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACKAGE = "dynaresize"


@dataclass(frozen=True)
class Citation:
    """A piece of a doc to check: a backtick span, a code-block line or a diagram token."""

    path: str
    line: int
    text: str
    after: str = ""
    """The text after the span on its line (for a cited default)."""
    kind: str = "span"
    """'span', 'code' (a line of a code block), 'diagram' (a token in one) or 'link'."""


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    cited: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: `{self.cited}`: {self.problem}"


@dataclass
class ClassInfo:
    """A class: its members (methods, class and instance attributes) and its base names."""

    members: set[str] = field(default_factory=set)
    bases: list[str] = field(default_factory=list)


@dataclass
class CodeIndex:
    """Modules (dotted name -> top-level names), classes by name, and every identifier and
    string literal that occurs in the package and in the repository's scripts."""

    modules: dict[str, set[str]] = field(default_factory=dict)
    classes: dict[str, list[ClassInfo]] = field(default_factory=dict)
    identifiers: set[str] = field(default_factory=set)
    strings: set[str] = field(default_factory=set)
    files: list[str] = field(default_factory=list)
    script_text: str = ""

    def modules_ending(self, dotted: str) -> list[str]:
        """Our modules whose dotted name is `dotted` or ends with `.dotted`."""
        return [m for m in self.modules if m == dotted or m.endswith("." + dotted)]

    def class_has(self, name: str, member: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether some class `name` (or a base of it, by name) has `member`."""
        for info in self.classes.get(name, []):
            if member in info.members:
                return True
            for base in info.bases:
                if base not in seen and self.class_has(base, member, seen | {name}):
                    return True
        return False

    def defines(self, name: str) -> bool:
        """A class, function, module-level name or module of that name exists somewhere."""
        return (name in self.classes or any(name in names for names in self.modules.values())
                or any(m.rsplit(".", 1)[-1] == name for m in self.modules))

    def resolve(self, dotted: str) -> bool:
        """`pkg.module.Name.attr`, `module.func`, `Class.member` resolve in our code."""
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            for module in self.modules_ending(".".join(parts[:cut])):
                if self._resolve_in_module(module, parts[cut:]):
                    return True
        if parts[0] in self.classes and len(parts) == 2:
            return self.class_has(parts[0], parts[1])
        return False

    def _resolve_in_module(self, module: str, rest: list[str]) -> bool:
        if not rest:
            return True
        head = rest[0]
        if f"{module}.{head}" in self.modules:
            return self._resolve_in_module(f"{module}.{head}", rest[1:])
        if head not in self.modules[module]:
            return False
        if len(rest) == 1:
            return True
        return len(rest) == 2 and self.class_has(head, rest[1])

    def matching_files(self, path: str) -> list[str]:
        """Repository files and folders whose path is `path` or ends with `/path`."""
        path = path.rstrip("/")
        return [f for f in self.files if f == path or f.endswith("/" + path)]


def _class_info(node: ast.ClassDef) -> ClassInfo:
    info = ClassInfo(bases=[b.id if isinstance(b, ast.Name) else ast.unparse(b).split(".")[-1]
                            for b in node.bases])
    info.members = _top_level_names(node)  # methods, class attributes, dataclass fields
    for item in ast.walk(node):  # instance attributes
        if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                and item.value.id == "self":
            info.members.add(item.attr)
    return info


def _top_level_names(tree: ast.Module | ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _add_source(index: CodeIndex, tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            index.classes.setdefault(node.name, []).append(_class_info(node))
            index.identifiers.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            index.identifiers.add(node.name)
        elif isinstance(node, ast.Name):
            index.identifiers.add(node.id)
        elif isinstance(node, ast.Attribute):
            index.identifiers.add(node.attr)
        elif isinstance(node, ast.arg):
            index.identifiers.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            index.identifiers.add(node.arg)
        elif isinstance(node, ast.alias):
            index.identifiers.update((node.asname or node.name).split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            index.strings.add(node.value)


def build_index(root: Path) -> CodeIndex:
    """Index `root/src/dynaresize` (modules), `root/bench` and `root/tests` (identifiers and
    strings only), and the files under `root` (not .git, caches or run directories)."""
    index = CodeIndex()
    src = root / "src"
    for path in sorted((src / PACKAGE).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        rel = path.relative_to(src).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        index.modules[".".join(parts)] = _top_level_names(tree)
        _add_source(index, tree)
    for folder in ("bench", "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            _add_source(index, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    skip = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache"}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if skip.intersection(rel.parts) or rel.parts[0].endswith(".egg-info"):
            continue
        index.files.append(rel.as_posix())
    index.script_text = "\n".join(p.read_text(encoding="utf-8")
                                  for p in sorted((root / "scripts").glob("*.sh")))
    return index


def is_external(dotted: str) -> bool:
    """Whether `dotted` starts with an importable top-level package other than ours."""
    head = dotted.split(".")[0]
    if head == PACKAGE or not head.isidentifier():
        return False
    try:
        return importlib.util.find_spec(head) is not None
    except (ImportError, ValueError):
        return False


# ----------------------------------------------------------------------------- config keys


def config_lookup(key: str) -> tuple[bool, Any]:
    """(exists, default) of a dotted config key (`rollout.engine`, `controller.hysteresis.band`,
    `faults.kill`); a table (`controller.hysteresis`) exists with default None."""
    from dynaresize.config import Config

    node: Any = Config()
    for part in key.split("."):
        if not dataclasses.is_dataclass(node) or part not in typing.get_type_hints(type(node)):
            return False, None
        node = getattr(node, part)
    return True, (None if dataclasses.is_dataclass(node) else node)


def config_sections() -> tuple[str, ...]:
    from dynaresize.config import Config

    return tuple(f.name for f in dataclasses.fields(Config))


def config_field_names() -> set[str]:
    """Every key name at any depth (`band`, `pack_batch`, `num_devices`)."""
    from dynaresize.config import schema

    names: set[str] = set()
    for obj in vars(schema).values():
        if isinstance(obj, type) and dataclasses.is_dataclass(obj):
            names.update(f.name for f in dataclasses.fields(obj))
    return names


UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "s": 1}


def toml_literal(raw: str) -> tuple[bool, Any]:
    """(ok, value) of a cited value: a TOML literal, or a number with a unit (4 MiB)."""
    raw = raw.strip().rstrip(".,;:")
    m = re.fullmatch(r"([-+\d.e_]+)\s*(KiB|MiB|GiB|s)", raw)
    if m:
        ok, number = toml_literal(m.group(1))
        return (ok, number * UNITS[m.group(2)]) if ok else (False, None)
    try:
        return True, tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return False, None


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    return bool(a == b)
