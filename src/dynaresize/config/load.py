"""Loading a Config: TOML file + `--set key=value` overrides, and back to TOML (`--dry-run`)."""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import typing
from pathlib import Path
from typing import Any

from dynaresize.config.literal import toml_repr
from dynaresize.config.schema import Config, ConfigError, KillEntry, ResizeEntry
from dynaresize.config.validate import _is_file, validate


def _section_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(name: str, value: Any, typ: Any, source: str) -> Any:
    if typ == list[ResizeEntry]:
        return _resize_entries(name, value, source)
    if typ == list[KillEntry]:
        return _resize_entries(name, value, source, KillEntry)
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(name, value, "must be true or false", source)
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(name, value, "must be an integer", source)
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(name, value, "must be a finite number", source)
            return float(value)
        raise ConfigError(name, value, "must be a number", source)
    if typ == dict[str, Any]:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(name, value, "must be a table, e.g. {min_digits = 2}", source)
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(name, value, "must be a string", source)
    return value


def _resize_entries(name: str, value: Any, source: str, cls: type = ResizeEntry) -> list[Any]:
    """An array of tables of `cls` ([[resize.schedule]], [[faults.kill]])."""
    if isinstance(value, cls):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(name, value, f"must be an array of tables ([[{name}]])", source)
    hints = typing.get_type_hints(cls)
    entries = []
    for i, item in enumerate(value):
        if isinstance(item, cls):
            entries.append(item)
            continue
        if not isinstance(item, dict):
            raise ConfigError(f"{name}[{i}]", item, "must be a table", source)
        entry = cls()
        for key, v in item.items():
            if key not in hints:
                raise ConfigError(f"{name}[{i}].{key}", v,
                                  f"unknown key; allowed: {', '.join(hints)}", source)
            setattr(entry, key, _coerce(f"{name}[{i}].{key}", v, hints[key], source))
        entries.append(entry)
    return entries


def _apply(cfg: Config, data: dict[str, Any], source: str) -> None:
    sections = {f.name: f for f in dataclasses.fields(Config)}
    for sec_name, sec_value in data.items():
        if sec_name not in sections:
            raise ConfigError(sec_name, sec_value,
                              f"unknown section; allowed: {', '.join(sections)}", source)
        _apply_table(getattr(cfg, sec_name), sec_name, sec_value, source)


def _apply_table(section: Any, name: str, table: Any, source: str) -> None:
    """Set `section`'s keys from a TOML table; a key whose type is a dataclass is a nested
    table (`[controller.hysteresis]`)."""
    if not isinstance(table, dict):
        raise ConfigError(name, table, "must be a table of keys", source)
    hints = _section_types(type(section))
    for key, value in table.items():
        full = f"{name}.{key}"
        if key not in hints:
            raise ConfigError(full, value,
                              f"unknown key; allowed in [{name}]: {', '.join(hints)}", source)
        if dataclasses.is_dataclass(hints[key]):
            _apply_table(getattr(section, key), full, value, source)
        else:
            setattr(section, key, _coerce(full, value, hints[key], source))


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value` (or `section.table.key=value`) → (dotted key, value parsed as a
    TOML literal, else a string)."""
    if "=" not in text:
        raise ConfigError("--set", text, "expected key=value, e.g. run.steps=4")
    key, raw = text.split("=", 1)
    key, raw = key.strip(), raw.strip()
    if not 1 <= key.count(".") <= 2 or "" in key.split("."):
        raise ConfigError("--set", text, "key must be section.key (or section.table.key), "
                                         "e.g. run.steps or controller.hysteresis.band")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def _read_toml(p: Path) -> dict[str, Any]:
    """The parsed TOML file `--config p`; a ConfigError says what is wrong with it."""
    if _is_file(str(p), directory_ok=True) and not _is_file(str(p)):
        raise ConfigError("--config", str(p), "is a directory; give a TOML file, e.g. "
                          "examples/real-arith.toml")
    if not _is_file(str(p)):
        raise ConfigError("--config", str(p), "file not found")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", str(p), f"not valid TOML ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--config", str(p), f"cannot read it as UTF-8 text ({exc})") \
            from None


def _dotted_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    """`{"a": {"b": 1}}` -> ["a.b"] (every leaf's dotted key)."""
    keys: list[str] = []
    for key, value in data.items():
        full = f"{prefix}{key}"
        keys += _dotted_keys(value, full + ".") if isinstance(value, dict) else [full]
    return keys


def _source_of(field_name: str, sources: dict[str, str]) -> str:
    """Where the value behind `field_name` was last set ('' if it is a default)."""
    found = ""
    for key, source in sources.items():
        if (key == field_name or field_name.startswith((key + ".", key + "["))
                or key.startswith(field_name + ".")):
            found = source
    return found


def load_config(path: str | os.PathLike[str] | None = None,
                overrides: list[str] | tuple[str, ...] = (),
                *, check_machine: bool = True, check_packages: bool = True) -> Config:
    """Build a validated Config from defaults, an optional TOML file and overrides.
    `check_packages=False`: a `model.source` whose package is missing is not an error (what
    `--dry-run` shows before the package is installed). A value that fails validation is
    reported with the file (or `--set`) that set it."""
    cfg = Config()
    sources: dict[str, str] = {}
    if path is not None:
        p = Path(path)
        data = _read_toml(p)
        _apply(cfg, data, str(p))
        sources.update(dict.fromkeys(_dotted_keys(data), str(p)))
    for text in overrides:
        key, value = parse_override(text)
        *tables, name = key.split(".")
        nested: dict[str, Any] = {name: value}
        for table in reversed(tables):
            nested = {table: nested}
        _apply(cfg, nested, "--set")
        sources.pop(key, None)
        sources[key] = "--set"
    try:
        validate(cfg, check_machine=check_machine, check_packages=check_packages)
    except ConfigError as exc:
        source = _source_of(exc.field_name, sources)
        if source and not exc.source:
            raise exc.from_source(source) from None
        raise
    return cfg


def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config from `Config.to_dict()` output (e.g. inside a device process)."""
    cfg = Config()
    _apply(cfg, data, "config")
    validate(cfg, check_machine=False)
    return cfg


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return toml_repr(value)
    if isinstance(value, str):  # a basic string: backslash, quote and control chars escaped
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return '"' + "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}"
                             for ch in escaped) + '"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def _toml_table(name: str, section: Any) -> list[str]:
    """`[name]` with its keys and their docs, then its nested tables (`[name.table]`)."""
    lines, nested = [f"[{name}]"], []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            nested += _toml_table(f"{name}.{f.name}", value)
        elif not isinstance(value, list):
            lines.append(f"{f.name} = {_toml_value(value)}  # {f.metadata.get('doc', '')}")
    return lines + [""] + nested


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML (what `--dry-run` prints)."""
    lines: list[str] = []
    for sec in dataclasses.fields(cfg):
        lines += _toml_table(sec.name, getattr(cfg, sec.name))
    for e in cfg.faults.kill:
        lines += ["[[faults.kill]]", f"device = {e.device}", f"step = {e.step}",
                  f'at = "{e.at}"', *([f'how = "{e.how}"'] if e.how != "kill" else []), ""]
    for e in cfg.resize.schedule:
        lines += ["[[resize.schedule]]", f"step = {e.step}", f'at = "{e.at}"',
                  f'move = "{e.move}"', f"num_devices = {e.num_devices}", ""]
    return "\n".join(lines)
