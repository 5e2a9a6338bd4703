"""Property-based tests (hypothesis) over the parsers of user input: whatever a user writes, the
config parser raises nothing but ConfigError and the trace parser nothing but ValueError."""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynaresize.config import Config, ConfigError, load_config
from dynaresize.sim.traces import TRACE_KEYS, parse_trace_lines

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

SECTIONS = {f.name: [g.name for g in dataclasses.fields(f.default_factory())]
            for f in dataclasses.fields(Config)}
SECTION_NAMES = [*SECTIONS, "faults", "bogus"]
KEYS = sorted({k for keys in SECTIONS.values() for k in keys} | {"kill", "nope", "device",
                                                                   "step", "at"})

scalars = st.one_of(st.integers(min_value=-2**70, max_value=2**70), st.booleans(),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=12), st.sampled_from(["start", "rollout:0.5", "train",
                                                           "resize", "rollout->train",
                                                           "jsonl", "cuda", "hysteresis"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)), max_leaves=6)


def toml_value(v: Any) -> str:
    """A TOML literal (inline) for what `values` draws."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) \
            else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


documents = st.dictionaries(
    st.sampled_from(SECTION_NAMES),
    st.dictionaries(st.sampled_from(KEYS), values, max_size=4), max_size=4)


def load(text: str | bytes, overrides: list[str] = ()) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.toml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_config(path, overrides, check_machine=False)
        except ConfigError:
            pass


@SETTINGS
@given(documents)
def test_config_documents_raise_only_config_error(doc: dict[str, dict[str, Any]]) -> None:
    text = "\n".join(f"[{sec}]\n" + "\n".join(f"{k} = {toml_value(v)}" for k, v in body.items())
                     for sec, body in doc.items())
    load(text)


@SETTINGS
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_config_raw_text_raises_only_config_error(text: str | bytes) -> None:
    load(text)


@SETTINGS
@given(st.lists(st.one_of(
    st.builds(lambda s, k, v: f"{s}.{k}={toml_value(v)}", st.sampled_from(SECTION_NAMES),
              st.sampled_from(KEYS), values),
    st.text(max_size=30)), max_size=4))
def test_config_overrides_raise_only_config_error(overrides: list[str]) -> None:
    try:
        load_config(None, overrides, check_machine=False)
    except ConfigError:
        pass


trace_values = st.one_of(st.integers(min_value=-5, max_value=3),
                         st.integers(min_value=-2**80, max_value=2**80),
                         st.booleans(), st.none(), st.floats(), st.text(max_size=4))
trace_lines = st.one_of(
    st.builds(json.dumps, st.dictionaries(st.sampled_from([*TRACE_KEYS, "x"]), trace_values,
                                          max_size=6)),
    st.builds(lambda d: json.dumps({k: d.get(k, 1) for k in TRACE_KEYS}),
              st.dictionaries(st.sampled_from(TRACE_KEYS), st.integers(0, 3))),
    st.text(max_size=40), st.just(""), st.just("[1, 2]"), st.just("[" * 5000))


@SETTINGS
@given(st.lists(trace_lines, max_size=12))
def test_trace_parser_raises_only_value_error(lines: list[str]) -> None:
    try:
        workload = parse_trace_lines(lines, "fuzz.jsonl")
    except ValueError as exc:
        assert "fuzz.jsonl" in str(exc)
        return
    assert workload.num_steps is not None and workload.num_steps >= 1
