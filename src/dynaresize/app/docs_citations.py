"""What a doc cites (the docs check's reading, `app.docs_check`): backtick spans outside code
blocks, the lines of code blocks, the CamelCase names and `.py` paths of unlabelled blocks
(diagrams) and markdown links, each with its file and line (`Citation`). Shell continuations
are joined first; a section whose heading starts with "Removed" is skipped."""

from __future__ import annotations

import re

from dynaresize.app.docs_index import Citation

CAMEL = re.compile(r"\b_?[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+\b")


def citations(path: str, text: str) -> list[Citation]:
    """Backtick spans (outside code blocks), code-block lines and diagram tokens of a doc. A
    section whose heading starts with "Removed" names code that is gone: it is skipped."""
    out: list[Citation] = []
    fence: str | None = None
    carry, carry_line, removed = "", 0, False
    lines = _join_continued(text.splitlines())
    indented_code, prev_blank = False, True  # indented code starts after a blank line
    for number, line in lines:
        stripped = line.strip()
        indented_code = line.startswith("    ") and (indented_code or prev_blank) \
            and not carry and fence is None
        prev_blank = not stripped
        if fence is None and re.match(r"#+ ", stripped):
            removed = bool(re.match(r"#+ Removed\b", stripped))
        if removed:
            continue
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip() or "diagram"
            continue
        if fence is not None:
            if fence != "diagram":
                out.append(Citation(path, number, stripped, kind="code"))
            else:
                out += [Citation(path, number, m.group(0), kind="diagram")
                        for m in re.finditer(CAMEL.pattern + r"|[\w./-]+\.py\b", line)]
            continue
        if indented_code:
            out.append(Citation(path, number, stripped, kind="code"))
            continue
        joined = f"{carry} {line}" if carry else line
        start = carry_line if carry else number
        if joined.count("`") % 2:
            carry, carry_line = joined, start
            continue
        carry = ""
        for m in re.finditer(r"`([^`]+)`", joined):
            out.append(Citation(path, start, m.group(1).strip(), joined[m.end():]))
        for m in re.finditer(r"\]\(([^)\s#]*)(#[^)\s]*)?\)", re.sub(r"`[^`]*`", "", joined)):
            if "://" not in m.group(1) and (m.group(1) or m.group(2)):
                out.append(Citation(path, start, m.group(1) + (m.group(2) or ""),
                                    kind="link"))
    return out


def _join_continued(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, line) with shell continuations (`\\` at the end) joined."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in enumerate(lines, 1):
        if pending is not None:
            number, line = pending[0], pending[1] + " " + line.strip()
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        out.append((number, line))
    return out
