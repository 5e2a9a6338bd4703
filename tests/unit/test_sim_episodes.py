"""Multi-turn episodes in the twin: the episode model (pure, ms), the multi-turn engine (tool
waits off the engine), and one small twin run (every episode comes out exactly once)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dynaresize.core.rundir import read_jsonl
from dynaresize.core.types import RequestSpec
from dynaresize.sim.calibrate import cost_model_from_fit
from dynaresize.sim.device_types import Lengths
from dynaresize.sim.engine_turns import MultiTurnEngine, SimEpisodeInflight
from dynaresize.sim.episodes import (
    AGENTIC_TURNS,
    EpisodeModel,
    episode_model_from_summary,
    episode_workload,
    load_episode_model,
)
from dynaresize.sim.run import simulate
from dynaresize.sim.workloads import StepRequests

FIT = {"iteration_overhead_s": 0.02, "decode_s_per_request_iter": 4e-4,
       "prefill_s_per_token": 1e-4, "train_step_overhead_s": 0.3, "train_s_per_token": 9e-5,
       "weight_sync_latency_s": 0.07, "weight_transfer_s": 0.01, "max_running_requests": 8.0}
SUMMARY = {"turns_per_episode": 2.0, "tokens_per_turn": 12.7,
           "observation_tokens_per_turn": 13.4, "env_s_p50": 0.351, "env_s_p90": 0.6}


@pytest.mark.parametrize("mean,cap", [(1.0, 1), (1.0, 4), (2.0, 4), (3.0, 6), (4.0, 4)])
def test_continue_probability_gives_the_mean(mean: float, cap: int) -> None:
    q = EpisodeModel(mean, cap, 10, 5, 0.1, 0.2).continue_probability()
    assert sum(q ** k for k in range(cap)) == pytest.approx(mean, abs=1e-6)


def test_draw_is_seeded_and_ends_each_episode_cleanly() -> None:
    model = EpisodeModel(2.5, 5, 50, 20, 0.3, 0.9)
    a, b = model.draw(64, 8, 1, 3), model.draw(64, 8, 1, 3)
    assert np.array_equal(a.model_tokens, b.model_tokens) and np.array_equal(a.tool_s, b.tool_s)
    assert not np.array_equal(a.model_tokens, model.draw(64, 8, 1, 4).model_tokens)
    assert 1 <= a.num_turns.min() and a.num_turns.max() <= 5
    assert a.num_turns.mean() == pytest.approx(2.5, abs=0.15)
    for p, s in ((0, 0), (5, 3), (63, 7)):
        turns = a.turns(p, s)
        assert len(turns) == a.num_turns[p, s]
        assert all(m >= 1 for m, _, _ in turns)
        assert turns[-1][1:] == (0, 0.0)  # no tool after the last turn
        assert sum(m + o for m, o, _ in turns) == a.trajectory_tokens()[p, s]
    tools = a.tool_s[a.tool_s > 0]
    assert np.median(tools) == pytest.approx(0.3, rel=0.1)
    assert np.quantile(tools, 0.9) == pytest.approx(0.9, rel=0.15)


def test_fit_from_a_live_summary_and_round_trip(tmp_path: Path) -> None:
    model = episode_model_from_summary(SUMMARY, max_turns=2, source="live")
    assert (model.mean_turns, model.max_turns, model.continue_probability()) == (2.0, 2, 1.0)
    draw = model.draw(256, 8, 0, 0)
    assert (draw.num_turns == 2).all()
    assert draw.model_tokens[draw.model_tokens > 0].mean() == pytest.approx(12.7, rel=0.05)
    assert model.tool_s_p50 == 0.351 and not model.keep_kv
    path = tmp_path / "episodes.json"
    path.write_text(json.dumps({"episode_model": model.to_json()}))
    assert load_episode_model(path) == model
    measured = episode_model_from_summary({**SUMMARY, "env_s_values": [0.0, 0.3, 6.0]}, 3)
    tools = measured.draw(64, 8, 0, 0).tool_s
    assert set(np.unique(tools)) == {0.0, 0.3, 6.0}  # resampled, no log-normal tail
    path.write_text(json.dumps(measured.to_json()))
    assert load_episode_model(path) == measured


@pytest.mark.parametrize("change,needle", [
    ({"turns_per_episode": 3.0}, "turns_per_episode"),
    ({"env_s_p50": "fast"}, "env_s_p50"),
    ({"tokens_per_turn": None}, "tokens_per_turn")])
def test_bad_summary_names_the_field(change: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        episode_model_from_summary({**SUMMARY, **change}, max_turns=2)
    with pytest.raises(ValueError, match="max-turns"):
        episode_model_from_summary(SUMMARY)


@pytest.mark.parametrize("data,needle", [
    ({"mean_turns": 2}, "missing field 'max_turns'"),
    ({**AGENTIC_TURNS.to_json(), "turns": 3}, "unknown field 'turns'"),
    ({**AGENTIC_TURNS.to_json(), "keep_kv": 1}, "keep_kv"),
    ({**AGENTIC_TURNS.to_json(), "tool_s_values": [0.1, "x"]}, "tool_s_values"),
    ({**AGENTIC_TURNS.to_json(), "tool_s_p90": 0.5}, "tool_s_p90")])
def test_bad_episode_file_names_the_field(tmp_path: Path, data: dict, needle: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=needle):
        load_episode_model(path)


class _Draw:
    def __init__(self, turns: dict[int, list[tuple[int, int, float]]]) -> None:
        self._turns = turns

    def turns(self, prompt: int, sample: int) -> list[tuple[int, int, float]]:
        return self._turns[prompt]


class _Episodes:
    """Prompt 0: a 10-token turn, a 100 s tool, a 10-token turn; prompt 1: one 200-token turn."""

    def __init__(self, keep_kv: bool = False) -> None:
        self.episode_model = EpisodeModel(1.5, 2, 10, 5, 1, 1, keep_kv=keep_kv)
        self.draw = _Draw({0: [(10, 5, 100.0), (10, 0, 0.0)], 1: [(200, 0, 0.0)]})

    def episodes(self, step: int) -> _Draw:
        return self.draw

    def step_requests(self, step: int) -> StepRequests:
        return StepRequests(step, np.array([[25], [200]]), np.array([50, 50]))


def _spec(prompt: int) -> RequestSpec:
    return RequestSpec(0, prompt, 0, 0, (50,), 1000, 0)


def _engine(keep_kv: bool = False) -> MultiTurnEngine:
    return MultiTurnEngine(0, cost_model_from_fit(FIT), Lengths(_Episodes(keep_kv)))  # type: ignore[arg-type]


def test_tool_wait_is_off_the_engine() -> None:
    alone = _engine()
    alone.submit([_spec(0)])
    done_alone, alone_s = alone.run(1e9, True, 0)
    both = _engine()
    both.submit([_spec(0), _spec(1)])
    done, both_s = both.run(1e9, True, 0)
    assert [c.spec.prompt for c in done] == [1, 0]  # the long turn ends during the tool
    assert [c.num_tokens for c in done] == [200, 25]  # trajectory: 10 + 5 + 10
    assert both.num_turns == 3 and both.is_empty
    # the 200-token turn ran inside episode 0's tool wait: the engine waited that much less
    decode_s = sum(cost_model_from_fit(FIT).decode_iter_s(1, 0) for _ in range(190))
    assert alone.tool_idle_s - both.tool_idle_s == pytest.approx(decode_s, rel=0.05)
    assert both_s < alone_s + 0.05 and alone_s > 100.0


def test_kept_kv_prefills_only_the_observation() -> None:
    costs = cost_model_from_fit(FIT)
    spent = {}
    for keep in (False, True):
        engine = _engine(keep)
        engine.submit([_spec(0)])
        spent[keep] = engine.run(1e9, True, 0)[1]
    assert spent[False] - spent[True] == pytest.approx(costs.prefill_s(60), rel=1e-6)


def test_export_mid_tool_and_mid_turn_resumes_exactly() -> None:
    engine = _engine()
    engine.submit([_spec(0), _spec(1)])
    first, _ = engine.run(2.0, False, 0)  # episode 0 waits on its tool, 1 is mid-turn
    out = engine.export()
    assert first == [] and engine.is_empty
    got = sorted((w.spec.prompt, w.turn, w.num_done() > 0, w.tool_left_s > 0) for w in out
                 if isinstance(w, SimEpisodeInflight))
    assert got == [(0, 1, False, True), (1, 0, True, False)]
    other = _engine()
    other.submit(out)
    done, _ = other.run(1e9, True, 0)
    assert sorted(c.spec.prompt for c in done) == [0, 1]


def test_twin_run_writes_every_episode_once(tmp_path: Path) -> None:
    wl = episode_workload("agentic-turns", seed=1, requests_per_step=64)
    out = simulate(wl, gpus=8, steps=3, staleness=1, seed=1,
                   policies=("static", "hysteresis"), out_dir=tmp_path, split=4)
    rows = {r["policy"]: r for r in out["results"]}
    assert rows["hysteresis"]["migrated_per_step"] > 0  # episodes exported and resumed
    for policy in ("static", "hysteresis"):
        samples = read_jsonl(tmp_path / policy / "samples.jsonl")
        keys = [(s["step"], s["prompt"], s["sample"]) for s in samples]
        assert len(keys) == len(set(keys)) == 3 * 64
        for s in samples:
            traj = wl.step_requests(s["step"]).response_tokens[s["prompt"], s["sample"]]
            assert s["response_tokens"] == traj


def test_cli_calibrate_then_simulate_episodes(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    from dynaresize.cli import main

    summary = tmp_path / "timing.json"
    summary.write_text(json.dumps({"summary": {**SUMMARY, "max_turns": 2}}))
    model_path = tmp_path / "m.json"
    assert main(["calibrate", "--episodes", str(summary), "--out", str(model_path)]) == 0
    assert load_episode_model(model_path).mean_turns == 2.0
    capsys.readouterr()
    assert main(["simulate", "--episodes", str(model_path), "--gpus", "6", "--steps", "2",
                 "--requests-per-step", "32", "--split", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in out["results"]] == [
        "static", "colocated", "borrow", "hysteresis", "reference"]  # no oracle


@pytest.mark.parametrize("argv,needle", [
    (["calibrate", "--episodes", "{summary}", "--max-turns", "1"], "turns_per_episode"),
    (["calibrate", "--episodes", "{summary}"], "max-turns"),
    (["calibrate"], "RUN_DIR"),
    (["simulate", "--episodes", "{summary}"], "unknown field 'summary'"),
    (["simulate", "--episodes", "{model}", "--workload", "agentic-turns"], "synthetic preset"),
    (["simulate", "--workload", "agentic-turns", "--speculation", "das", "--gpus", "4",
      "--steps", "1", "--requests-per-step", "16", "--split", "2"], "speculation")])
def test_cli_bad_episode_input_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       argv: list[str], needle: str) -> None:
    from dynaresize.cli import main

    summary, model = tmp_path / "timing.json", tmp_path / "model.json"
    summary.write_text(json.dumps({"summary": SUMMARY}))
    model.write_text(json.dumps(AGENTIC_TURNS.to_json()))
    argv = [a.format(summary=summary, model=model) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
