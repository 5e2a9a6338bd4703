"""Traces of the digital twin: recorded request lengths replayed as a `Workload`.

A trace is JSON Lines in the design §5 format, one request per line with the integers of
`TRACE_KEYS`, validated line by line (`parse_trace_lines`: a bad line is a ValueError naming
the file, the line and the field). `write_trace` writes any workload's steps in that format;
`sim.calibrate.trace_from_run` builds one from a live run directory.
"""

from __future__ import annotations

import numpy as np

from dynaresize.sim.workloads import StepRequests, Workload

TRACE_KEYS = ("step", "prompt", "sample", "response_tokens", "prompt_tokens")


class TraceWorkload(Workload):
    """A replayed trace: every step holds prompts 0..P-1 x samples 0..S-1, the same P and S
    in every step (design §2.1: a fixed batch); steps are 0..num_steps-1."""

    def __init__(self, name: str, steps: list[StepRequests]) -> None:
        self.name = name
        self._steps = steps
        self.num_steps = len(steps)
        self.prompts_per_step, self.samples_per_prompt = steps[0].response_tokens.shape
        self.max_response_tokens = int(max(s.response_tokens.max() for s in steps))

    def step_requests(self, step: int) -> StepRequests:
        if not 0 <= step < len(self._steps):
            raise ValueError(f"trace {self.name}: step {step} not in 0..{len(self._steps) - 1}")
        return self._steps[step]


MAX_TRACE_VALUE = 2**31
"""Trace integers must be below this (token counts and indices fit int32)."""


def _parse_line(where: str, text: str) -> tuple[int, ...]:
    """One trace line → the five integers of TRACE_KEYS; ValueError names `where` and field."""
    import json

    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object with keys {', '.join(TRACE_KEYS)}")
    values = []
    for key in TRACE_KEYS:
        if key not in obj:
            raise ValueError(f"{where}: missing field {key!r}")
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: field {key!r} = {value!r}: must be an integer")
        if value < 0:
            raise ValueError(f"{where}: field {key!r} = {value}: must be >= 0")
        if value >= MAX_TRACE_VALUE:
            raise ValueError(f"{where}: field {key!r} = {value}: must be < {MAX_TRACE_VALUE}")
        values.append(value)
    return tuple(values)


def parse_trace_lines(lines: list[str], source: str) -> TraceWorkload:
    """Validate and assemble trace lines (blank lines skipped); `source` names the file in
    errors. Raises ValueError for a bad line, a duplicate (step, prompt, sample), or a step
    that is not a complete prompts x samples grid."""
    rows: dict[tuple[int, int, int], tuple[int, int]] = {}
    prompt_len: dict[tuple[int, int], int] = {}
    for line_no, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        where = f"{source}: line {line_no}"
        step, prompt, sample, response, prompt_toks = _parse_line(where, text)
        key = (step, prompt, sample)
        if key in rows:
            raise ValueError(f"{where}: duplicate (step, prompt, sample) = {key}")
        rows[key] = (response, prompt_toks)
        prompt_len.setdefault((step, prompt), prompt_toks)
    if not rows:
        raise ValueError(f"{source}: trace has no requests")
    num_steps = 1 + max(k[0] for k in rows)
    num_p = 1 + max(k[1] for k in rows)
    num_s = 1 + max(k[2] for k in rows)
    if num_steps * num_p * num_s != len(rows):  # a hole: name the first (bounded search)
        for step in range(num_steps):
            for p in range(num_p):
                for s in range(num_s):
                    if (step, p, s) not in rows:
                        raise ValueError(f"{source}: step {step} lacks prompt {p} sample {s} "
                                         f"(each step needs {num_p} prompts x {num_s} samples)")
    steps = []
    for step in range(num_steps):
        response = np.zeros((num_p, num_s), dtype=np.int64)
        prompts = np.zeros(num_p, dtype=np.int64)
        for p in range(num_p):
            for s in range(num_s):
                if (step, p, s) not in rows:
                    raise ValueError(f"{source}: step {step} lacks prompt {p} sample {s} "
                                     f"(each step needs {num_p} prompts x {num_s} samples)")
                response[p, s] = rows[(step, p, s)][0]
            prompts[p] = prompt_len[(step, p)]
        steps.append(StepRequests(step, response, prompts))
    return TraceWorkload(source, steps)


def load_trace(path: str) -> TraceWorkload:
    """Read a JSON Lines trace (design §5). Errors name the file, the line and the field."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read trace ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from None
    return parse_trace_lines(lines, str(path))


def write_trace(workload: Workload, steps: int, path: str) -> None:
    """Write `steps` steps of `workload` as a JSON Lines trace that `load_trace` reads back."""
    import json

    with open(path, "w", encoding="utf-8") as f:
        for step in range(steps):
            for row in workload.requests(step):
                f.write(json.dumps(row) + "\n")
