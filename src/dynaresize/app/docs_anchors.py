"""The anchors a markdown file offers to links (`target.md#anchor`), as GitHub renders it, for
the docs check (`app.docs_check`): each heading's id (GitHub's slug of its text, `-1`, `-2`
... for repeats) and every explicit HTML anchor (`<a id="name"></a>`, or `name=`). A
`{#id}` suffix on a heading is no anchor on GitHub (it becomes part of the slug): put
`<a id="id"></a>` on the line before the heading instead."""

from __future__ import annotations

import re
from collections import Counter

HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
TAG = re.compile(r"<[^>]+>")


def github_slug(heading: str) -> str:
    """GitHub's id of a heading with this text: the rendered text (links as their text,
    HTML tags dropped) lowercased, punctuation dropped, each space a hyphen."""
    text = TAG.sub("", LINK.sub(r"\1", heading)).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def markdown_anchors(text: str) -> set[str]:
    """Every anchor of a markdown document: its headings' ids (outside code blocks) and its
    HTML anchors."""
    anchors: set[str] = set()
    seen: Counter[str] = Counter()
    fence: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            marker = stripped[:3]
            fence = marker if fence is None else (None if marker == fence else fence)
            continue
        if fence is not None:
            continue
        anchors.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if m:
            slug = github_slug(m.group(2))
            anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return anchors
