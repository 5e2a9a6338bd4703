"""Typed, validated run configuration: TOML file + `--set key=value` overrides.

Importable without torch or Ray. Every bad value raises `ConfigError` naming the field, the
value and what is allowed; the CLI turns it into exit code 2. `schema` holds the sections,
`load` parses and prints them, `validate` checks them.
"""

from dynaresize.config.load import config_from_dict, load_config, parse_override, to_toml
from dynaresize.config.schema import *  # noqa: F403
from dynaresize.config.schema import Config, ConfigError
from dynaresize.config.validate import schedule_order, validate
from dynaresize.config.validate_machine import machine_device_limit

__all__ = ["Config", "ConfigError", "config_from_dict", "load_config", "machine_device_limit",
           "parse_override", "schedule_order", "to_toml", "validate"]
