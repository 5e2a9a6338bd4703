"""Multi-turn episodes in the twin: an episode model and the workload it makes (pure).

An *episode* is one sample (step, prompt, sample) made of turns. Turn t is one engine request:
the model writes `model[t]` tokens; unless it is the last turn, a tool (or the environment)
then answers after `tool_s[t]` seconds with `obs[t]` observation tokens that join the context
of turn t + 1. The engine model that serves turns is `sim.engine_turns.MultiTurnEngine`.

`EpisodeModel` (what `dynaresize calibrate --episodes SUMMARY.json` fits from a live run's
`envs.driver.timing_summary`, see bench/agentic_turns.py) draws, per episode, deterministic in
(seed, step):

- turns: 1 + the number of continuations, each taken with probability `q` while fewer than
  `max_turns` turns ran (a geometric law capped at `max_turns`); `q` is solved so that the mean
  is `mean_turns` (`continue_probability`);
- model tokens per turn: log-normal with median `median_model_tokens`, log std-dev
  `model_token_sigma`; with `long_model_tokens` > 0 a turn is long (that median instead) with a
  per-prompt probability ~ Beta(2, 3), as the `agentic` preset's responses; capped per turn;
- observation tokens per turn: log-normal, median `median_observation_tokens`, sigma
  `observation_token_sigma`;
- tool seconds per turn: drawn from `tool_s_values` (a live run's measured environment
  answers, resampled) when given, else log-normal through (`tool_s_p50`, `tool_s_p90`).

`EpisodeWorkload` puts a model over a preset's batch and prompt lengths: a request's
`response_tokens` is the episode's whole trajectory after the prompt (every turn's model and
observation tokens: what the sample record holds and training processes).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from dynaresize.sim.workloads import StepRequests, SyntheticWorkload, Workload

Z90 = 1.2815515655446004
"""The standard normal's 0.9 quantile: a log-normal's p90 = p50 * exp(Z90 * sigma)."""


@dataclass(frozen=True)
class EpisodeModel:
    """Turns per episode, tokens per turn, tool latency (module docstring)."""

    mean_turns: float
    max_turns: int
    median_model_tokens: float
    median_observation_tokens: float
    tool_s_p50: float
    tool_s_p90: float
    model_token_sigma: float = 0.5
    observation_token_sigma: float = 0.3
    long_model_tokens: float = 0.0
    """> 0: bimodal turns (a long turn with a per-prompt probability ~ Beta(2, 3))."""
    max_turn_tokens: int = 16384
    tool_s_values: tuple[float, ...] = ()
    """Measured environment answers (s) to resample; empty: the log-normal."""
    keep_kv: bool = False
    """True: the engine keeps an episode's context between turns (a prefix cache hit: only
    the observation is prefilled); False: every turn prefills its whole context, as the
    builtin `RolloutEngine` does (envs.serve)."""
    source: str = ""

    def __post_init__(self) -> None:
        checks = (("max_turns", self.max_turns >= 1, ">= 1"),
                  ("mean_turns", 1.0 <= self.mean_turns <= self.max_turns,
                   f"in [1, max_turns = {self.max_turns}]"),
                  ("median_model_tokens", self.median_model_tokens >= 1, ">= 1"),
                  ("median_observation_tokens", self.median_observation_tokens >= 0, ">= 0"),
                  ("tool_s_p50", self.tool_s_p50 >= 0, ">= 0"),
                  ("tool_s_p90", self.tool_s_p90 >= self.tool_s_p50, ">= tool_s_p50"),
                  ("model_token_sigma", self.model_token_sigma >= 0, ">= 0"),
                  ("observation_token_sigma", self.observation_token_sigma >= 0, ">= 0"),
                  ("long_model_tokens", self.long_model_tokens >= 0, ">= 0"),
                  ("max_turn_tokens", self.max_turn_tokens >= 1, ">= 1"),
                  ("tool_s_values", all(v >= 0 for v in self.tool_s_values),
                   "a list of seconds >= 0"))
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"episode model: {name} = {getattr(self, name)!r}: must be "
                                 f"{allowed}")

    @property
    def tool_sigma(self) -> float:
        if self.tool_s_p50 <= 0:
            return 0.0
        return math.log(self.tool_s_p90 / self.tool_s_p50) / Z90

    def continue_probability(self) -> float:
        """`q` with E[turns] = (1 - q^M) / (1 - q) = mean_turns (bisection; 1 at the cap)."""
        target, cap = self.mean_turns, self.max_turns
        if target >= cap - 1e-9:
            return 1.0
        lo, hi = 0.0, 1.0
        for _ in range(60):
            q = (lo + hi) / 2
            mean = sum(q ** k for k in range(cap))
            lo, hi = (q, hi) if mean < target else (lo, q)
        return (lo + hi) / 2

    def draw(self, num_prompts: int, num_samples: int, seed: int, step: int) -> EpisodeDraw:
        """Every episode of a step (module docstring), deterministic in (seed, step)."""
        rng = np.random.default_rng([seed, step, 0xE915])
        shape = (num_prompts, num_samples, self.max_turns)
        goes_on = rng.random(shape) < self.continue_probability()
        goes_on[..., -1] = False  # the cap
        num_turns = 1 + np.argmin(goes_on, axis=-1)  # turns before the first stop
        median = np.full(shape, float(self.median_model_tokens))
        if self.long_model_tokens > 0:
            p_long = rng.beta(2.0, 3.0, size=(num_prompts, 1, 1))
            median = np.where(rng.random(shape) < p_long, self.long_model_tokens, median)
        model = np.exp(np.log(median) + rng.normal(0.0, self.model_token_sigma, shape))
        model = np.clip(np.rint(model), 1, self.max_turn_tokens).astype(np.int64)
        obs = np.zeros(shape, dtype=np.int64)
        if self.median_observation_tokens > 0:
            obs = np.rint(self.median_observation_tokens * np.exp(
                rng.normal(0.0, self.observation_token_sigma, shape))).astype(np.int64)
        tool_s = np.zeros(shape)
        if self.tool_s_values:
            tool_s = rng.choice(np.asarray(self.tool_s_values, dtype=float), size=shape)
        elif self.tool_s_p50 > 0:
            tool_s = self.tool_s_p50 * np.exp(rng.normal(0.0, self.tool_sigma, shape))
        live = np.arange(self.max_turns) < num_turns[..., None]
        model = np.where(live, model, 0)
        after = np.arange(self.max_turns) < (num_turns - 1)[..., None]  # turns a tool answers
        return EpisodeDraw(num_turns.astype(np.int64), model, np.where(after, obs, 0),
                           np.where(after, tool_s, 0.0))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tool_s_values": list(self.tool_s_values)}


@dataclass(frozen=True)
class EpisodeDraw:
    """A step's episodes, arrays over (prompt, sample[, turn]); turns past an episode's end
    hold 0, as do the observation and tool time after its last turn."""

    num_turns: np.ndarray
    model_tokens: np.ndarray
    observation_tokens: np.ndarray
    tool_s: np.ndarray

    def trajectory_tokens(self) -> np.ndarray:
        """[P, S]: every model and observation token after the prompt."""
        return (self.model_tokens + self.observation_tokens).sum(axis=-1)

    def turns(self, prompt: int, sample: int) -> list[tuple[int, int, float]]:
        """(model tokens, observation tokens, tool seconds) of each turn of one episode."""
        n = int(self.num_turns[prompt, sample])
        return [(int(self.model_tokens[prompt, sample, t]),
                 int(self.observation_tokens[prompt, sample, t]),
                 float(self.tool_s[prompt, sample, t])) for t in range(n)]


class EpisodeWorkload(Workload):
    """`inner`'s batch and prompt lengths with `model`'s episodes (module docstring)."""

    def __init__(self, inner: SyntheticWorkload, model: EpisodeModel, name: str = "") -> None:
        self.inner, self.episode_model = inner, model
        self.name = name or f"{inner.name}+episodes"
        self.prompts_per_step = inner.prompts_per_step
        self.samples_per_prompt = inner.samples_per_prompt
        self.num_steps = inner.num_steps
        obs_cap = model.median_observation_tokens * math.exp(6 * model.observation_token_sigma)
        self.max_response_tokens = int(model.max_turns * (model.max_turn_tokens + obs_cap)) + 1
        """Above any trajectory: an episode is never 'truncated' as a whole."""
        self._cache: dict[int, tuple[EpisodeDraw, StepRequests]] = {}

    def _step(self, step: int) -> tuple[EpisodeDraw, StepRequests]:
        got = self._cache.get(step)
        if got is None:
            if len(self._cache) > 4:
                self._cache.clear()
            draw = self.episode_model.draw(self.prompts_per_step, self.samples_per_prompt,
                                   self.inner.seed, step)
            prompts = self.inner.step_requests(step).prompt_tokens
            got = self._cache[step] = (draw, StepRequests(step, draw.trajectory_tokens(),
                                                          prompts))
        return got

    def step_requests(self, step: int) -> StepRequests:
        return self._step(step)[1]

    def episodes(self, step: int) -> EpisodeDraw:
        return self._step(step)[0]


def load_episode_model(path: str | Path) -> EpisodeModel:
    """An episode model JSON (`calibrate --episodes --out`); ValueError naming file and field."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read an episode model ({exc})") from None
    data = data.get("episode_model", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object with the episode model's fields")
    known = {f.name: f for f in fields(EpisodeModel)}
    for key in data:
        if key not in known:
            raise ValueError(f"{path}: unknown field {key!r} (allowed: {', '.join(known)})")
    for key in ("mean_turns", "max_turns", "median_model_tokens",
                "median_observation_tokens", "tool_s_p50", "tool_s_p90"):
        if key not in data:
            raise ValueError(f"{path}: missing field {key!r}")
    values = data.get("tool_s_values", [])
    if not isinstance(values, list) or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            for v in values):
        raise ValueError(f"{path}: field 'tool_s_values' = {values!r}: must be a list of "
                         "seconds")
    for key, value in data.items():
        if key in ("source", "tool_s_values"):
            continue
        if key == "keep_kv":
            if not isinstance(value, bool):
                raise ValueError(f"{path}: field 'keep_kv' = {value!r}: must be true or false")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"{path}: field {key!r} = {value!r}: must be a number")
    try:
        return EpisodeModel(**{**data, "tool_s_values": tuple(float(v) for v in values),
                               "max_turns": int(data["max_turns"]),
                               "max_turn_tokens": int(data.get("max_turn_tokens", 16384))})
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


SUMMARY_KEYS = ("turns_per_episode", "tokens_per_turn", "observation_tokens_per_turn",
                "env_s_p50", "env_s_p90")
"""What `episode_model_from_summary` needs of a live run's `envs.driver.timing_summary`."""


def episode_model_from_summary(summary: dict[str, Any], max_turns: int | None = None,
                               source: str = "summary") -> EpisodeModel:
    """Fit an `EpisodeModel` to a live timing summary: its mean turns, mean tokens per turn
    (a log-normal's median is its mean * exp(-sigma^2 / 2)), tool p50 and p90. `max_turns`
    defaults to the summary's `max_turns`; the summary's `env_s_values` (every measured answer),
    if present, are resampled for the tool time. ValueError names `source` and the field."""
    for key in SUMMARY_KEYS:
        value = summary.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                or not math.isfinite(value):
            raise ValueError(f"{source}: field {key!r} = {value!r}: must be a number >= 0 "
                             f"(a summary has {', '.join(SUMMARY_KEYS)})")
    cap = max_turns if max_turns is not None else summary.get("max_turns")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"{source}: max turns = {cap!r}: give --max-turns N (>= 1) or a "
                         "'max_turns' field")
    mean_turns = float(summary["turns_per_episode"])
    if not 1.0 <= mean_turns <= cap:
        raise ValueError(f"{source}: field 'turns_per_episode' = {mean_turns}: must be in "
                         f"[1, max turns = {cap}]")
    values = summary.get("env_s_values", [])
    if not isinstance(values, list) or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0
            for v in values):
        raise ValueError(f"{source}: field 'env_s_values': must be a list of seconds >= 0")
    sigma = float(summary.get("model_token_sigma", 0.5))
    obs_sigma = float(summary.get("observation_token_sigma", 0.3))
    return EpisodeModel(
        mean_turns=mean_turns, max_turns=cap,
        median_model_tokens=max(1.0, summary["tokens_per_turn"] * math.exp(-sigma ** 2 / 2)),
        median_observation_tokens=summary["observation_tokens_per_turn"]
        * math.exp(-obs_sigma ** 2 / 2),
        tool_s_p50=float(summary["env_s_p50"]),
        tool_s_p90=max(float(summary["env_s_p90"]), float(summary["env_s_p50"])),
        model_token_sigma=sigma, observation_token_sigma=obs_sigma,
        max_turn_tokens=int(summary.get("max_new_tokens", 16384)),
        tool_s_values=tuple(float(v) for v in values), source=source)


AGENTIC_TURNS = EpisodeModel(mean_turns=3.0, max_turns=6, median_model_tokens=300.0,
                             long_model_tokens=4000.0, median_observation_tokens=200.0,
                             observation_token_sigma=0.5, tool_s_p50=1.0, tool_s_p90=5.0,
                             source="agentic-turns")
"""The `agentic-turns` preset: the `agentic` preset's batch, prompts (median 4,000 tokens)
and response lengths, per turn (short ~300-token tool calls, long ~4,000-token reasoning
turns with a per-prompt Beta(2, 3) probability), 3 turns per episode on average (at most 6),
~200 observation tokens and a tool of 1 s median, 5 s p90 between turns."""

EPISODE_PRESETS = {"agentic-turns": ("agentic", AGENTIC_TURNS)}
"""Episode workload presets: name -> (the preset giving batch and prompts, the model)."""


def episode_workload(model: EpisodeModel | str, inner: str = "agentic",
                     **kwargs: Any) -> EpisodeWorkload:
    """An `EpisodeWorkload` from a preset name (EPISODE_PRESETS) or a model over the
    synthetic preset `inner`; `kwargs` go to `get_workload` (seed, requests_per_step...)."""
    from dynaresize.sim.workloads import get_workload

    name = ""
    if isinstance(model, str):
        name, (inner, model) = model, EPISODE_PRESETS[model]
    return EpisodeWorkload(get_workload(inner, **kwargs), model,
                           name or f"{inner}+episodes({model.source or 'file'})")
