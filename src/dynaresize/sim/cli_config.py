"""The config inputs of `dynaresize simulate` besides its flags (`sim.cli`).

Faults: `simulate --config FILE.toml` takes the file's `[faults]` table (`[[faults.kill]]`
entries, as `dynaresize train` does) and `run.checkpoint_every`; `--set KEY=VALUE` sets those
keys (e.g. `--set "faults.kill=[{device=900, step=1, at='train'}]"`). Other sections of the file
are ignored (the flags describe the twin's run), other `--set` keys refused. Speculation: the
flag, else `--set sim.speculation=...`, else the file's `[sim] speculation` (the only key of
`[sim]`; another one is refused, from the file as from `--set`). A bad value raises
`ConfigError` naming its field (exit code 2 from the CLI).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynaresize.cli import UsageError

__all__ = ["TWIN_KEYS", "check_run_dir", "twin_faults", "twin_speculation"]


TWIN_KEYS = {"faults": ("kill", "timeout_s", "hang_timeout_s"), "run": ("checkpoint_every",)}
"""The config keys `simulate --config/--set` takes (the flags describe the rest of the run)."""


def twin_faults(path: str | None, sets: list[str], gpus: int, steps: int) -> Any:
    """`TwinFaults` from `--config` and `--set` (None if there are none), checked against
    `gpus` devices and `steps` steps: a bad entry raises `ConfigError` naming its field."""
    import tomllib

    from dynaresize.config import config_from_dict, parse_override
    from dynaresize.config.schema import ConfigError
    from dynaresize.sim.harness import TwinFaults

    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("--config", path, f"cannot read it ({exc})") from None
        try:
            whole = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("--config", path, f"not valid TOML ({exc})") from None
        for sec, keys in TWIN_KEYS.items():
            table = whole.get(sec, {})
            if not isinstance(table, dict):
                raise ConfigError(sec, table, "must be a table of keys", path)
            data[sec] = {k: v for k, v in table.items() if k in keys or sec == "faults"}
    for text in sets:
        key, value = parse_override(text)
        sec, name = key.split(".")
        if sec == "sim":
            continue  # `twin_speculation`
        if name not in TWIN_KEYS.get(sec, ()):
            allowed = ", ".join(f"{s}.{k}" for s, ks in TWIN_KEYS.items() for k in ks)
            raise ConfigError("--set", text, f"simulate takes {allowed} (flags set the rest)")
        data.setdefault(sec, {})[name] = value
    if not any(data.values()):
        return None
    data["run"] = {**data.get("run", {}), "steps": steps}
    data["allocation"] = {"num_rollout_devices": 1, "num_train_devices": gpus - 1}
    cfg = config_from_dict(data)  # the same parsing and checks as `dynaresize train`
    return TwinFaults(tuple(cfg.faults.kill), cfg.run.checkpoint_every,
                      cfg.faults.hang_timeout_s) or None


def check_run_dir(run_dir: str, what: str) -> None:
    """A live run directory to read (`--from-run DIR`, `calibrate DIR`): it and its
    config.toml must exist; UsageError names the directory."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UsageError(f"{what} {run_dir}: not a directory (give a `dynaresize train --out` "
                         "run directory)")
    if not (path / "config.toml").is_file():
        raise UsageError(f"{what} {run_dir}: no config.toml in that run directory (a "
                         "`dynaresize train --out DIR` run directory has one)")


def _file_speculation(path: str) -> Any:
    """The `--config` file's `[sim] speculation` (None if absent); any other key of `[sim]`
    raises ConfigError naming it and the file, as `--set sim.KEY=...` does."""
    import tomllib

    from dynaresize.config.schema import ConfigError

    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8")).get("sim", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # twin_faults names the problem
    if not isinstance(table, dict):
        raise ConfigError("sim", table, "must be a table of keys (speculation)", path)
    for key, got in table.items():
        if key != "speculation":
            raise ConfigError(f"sim.{key}", got, "unknown key: the twin's own key is "
                              "sim.speculation", path)
    return table.get("speculation")


def twin_speculation(flag: str | None, path: str | None, sets: list[str]) -> str | None:
    """The speculation switch: `--speculation`, else `--set sim.speculation=...`, else the
    `--config` file's `[sim] speculation` (default: off). The file's `[sim]` table
    and `--set sim.*` are checked whichever wins."""
    from dynaresize.config import parse_override
    from dynaresize.config.schema import ConfigError

    value = _file_speculation(path) if path is not None else None
    for text in sets:
        key, got = parse_override(text)
        if key.startswith("sim."):
            if key != "sim.speculation":
                raise ConfigError("--set", text, "the twin's own key is sim.speculation")
            value = got
    if flag is not None:
        return flag
    if value is not None and not isinstance(value, str):
        raise ConfigError("sim.speculation", value, "off, das or a JSON histogram file")
    return value
