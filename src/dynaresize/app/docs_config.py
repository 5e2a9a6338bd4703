"""The docs check's config citations (`app.docs_check`): `[section]`, `[[faults.kill]]`,
`section.key` and `section.table.key` must name a key (or table) of the config schema;
`key = value` in the span must be a value the key accepts (the config is loaded with it and its
policy checked); "`key` = value", "(`key`, value)" or "`key` (default value)" around a span must
give the key's schema default (`DEFAULT_AFTER`)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from dynaresize.app.docs_index import (
    Citation,
    Finding,
    config_lookup,
    config_sections,
    same_value,
    toml_literal,
)

DEFAULT_AFTER = (re.compile(r"^\s*=\s*([^\s,;)]+(?:\s(?:KiB|MiB|GiB|s)\b)?)"),
                 re.compile(r"^\s*\((?:the\s+)?default:?\s+([^\s,;)]+)"),
                 re.compile(r"^\s*,\s*(?:default\s+)?([-+\d.e]+|true|false)\)"))
"""What may follow a cited key on its line to give its default: `= value`, `(default value)`,
`, value)`."""
DEFAULT_WORD = re.compile(r"^\s*\((?:the\s+)?default\)")
"""A "(default)" after a cited key or `key = value`: that value is the default."""


class ConfigCitations:
    """Checks citations of config keys, tables, values and defaults against the schema,
    counting each in `counts` (the checker's: "config key", "cited default", "cited value")."""

    def __init__(self, counts: Counter[str]) -> None:
        self.counts = counts
        self.sections = config_sections()

    def key(self, c: Citation, key: str, table: bool = False) -> list[Finding]:
        """`key` (a table if `table`) exists; a default cited after it is the schema's."""
        self.counts["config key"] += 1
        exists, default = config_lookup(key)
        if not exists:
            section = key.split(".")[0]
            hint = ("" if section in self.sections else
                    f" (sections: {', '.join(self.sections)})")
            return _finding(c, f"no config {'table' if table else 'key'} {key!r}{hint}")
        for pattern in DEFAULT_AFTER:
            m = pattern.match(c.after)
            if m and default is not None:
                return self._default(c, key, default, m.group(1))
        if isinstance(default, bool) and DEFAULT_WORD.match(c.after):
            return self._default(c, key, default, "true")
        return []

    def value(self, c: Citation, key: str, raw: str) -> list[Finding]:
        """`key = raw` of a config section: the key exists and accepts `raw` (or, followed by
        "(default)", `raw` is its default). A placeholder (`eval.every = N`) is not checked."""
        found = self.key(c, key)
        ok, value = toml_literal(raw)
        if found or not ok:  # a placeholder (`eval.every = N`) is not checked
            return found
        if DEFAULT_WORD.match(c.after):
            return self._default(c, key, config_lookup(key)[1], raw)
        from dynaresize.config import ConfigError, load_config
        from dynaresize.control.registry import check_policy

        self.counts["cited value"] += 1
        try:
            check_policy(load_config(None, [f"{key}={raw.strip()}"], check_machine=False))
        except ConfigError as exc:
            if exc.field_name == key:
                return _finding(c, f"not a value this key accepts: {exc}")
        return []

    def _default(self, c: Citation, key: str, default: Any, raw: str) -> list[Finding]:
        ok, claimed = toml_literal(raw)
        self.counts["cited default"] += ok
        if not ok or same_value(claimed, default):
            return []
        return _finding(c, f"cited default {raw.strip()} but the schema's default is "
                           f"{default!r} (config/schema.py)", key)


def _finding(c: Citation, problem: str, cited: str | None = None) -> list[Finding]:
    return [Finding(c.path, c.line, cited or c.text, problem)]
