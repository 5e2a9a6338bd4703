"""Smoke test of `dynaresize bench resize` on the tiny model (one repetition): the structure of
the result, no group creation on a repeated membership, the naive resize slower than ours.

It starts its own 4 device actors (the naive path kills actors, and the first resizes must
create their groups), inside the session's Ray cluster."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ray


def test_bench_resize_tiny(ray_cluster: None) -> None:
    from dynaresize.app.bench import format_table
    from dynaresize.app.benchmarks.resize_latency import run_resize_bench

    lines: list[str] = []
    # one naive move keeps it short (each naive resize starts fresh processes)
    result = run_resize_bench(["tiny"], repeats=1, naive_moves=("train->rollout",),
                              progress=lines.append)
    (model,) = result["models"]
    assert model["name"] == "tiny" and model["num_params"] > 0
    labels = [(m["move"], m["label"]) for m in model["ours"]]
    assert labels.count(("rollout->train", "first")) == 1
    assert labels.count(("train->rollout", "repeat")) == 1
    for m in model["ours"]:
        kinds = {op["kind"] for op in m["ops"]}
        assert {"join_group", "reshard", "commit"} <= kinds
        if m["move"] == "rollout->train":
            assert {"stop_admission", "export_inflight", "release_kv"} <= kinds
        else:
            assert {"load_weights", "alloc_kv", "start_serving"} <= kinds
        assert m["ok"] and m["critical_path_s"] > 0 and m["bytes_moved"] > 0
        assert 0 < m["peak_staging_bytes"] <= m["staging_bytes"]
        assert abs(sum(m["path_shares"].values()) - 1.0) < 1e-6
        assert m["num_group_creations"] == (4 if m["label"] == "first" else 0)
    assert set(model["naive"]) == {"train->rollout"}
    assert all(n["loaded_state_matches"] for n in model["naive"].values())
    rows = model["summary"]
    assert [r["move"] for r in rows] == ["rollout->train", "train->rollout"]
    for row in rows:
        assert row["group_creations_repeat"] == 0 and row["group_creations_first"] > 0
    # design §4: rollout->train waits for the reshard; train->rollout serves while its
    # shards stream out, so the reshard is only on the training group's path
    assert "reshard" in rows[0]["path_shares"]
    assert "reshard" not in rows[1]["path_shares"] and "load_weights" in rows[1]["path_shares"]
    assert rows[1]["ours_group_ready_s"] >= rows[1]["ours_repeat_s"]
    assert rows[1]["ratio"] > 1 and rows[1]["naive_s"] > rows[1]["ours_repeat_s"]
    assert "ratio" not in rows[0]
    assert "naive / ours" in format_table(result)
    assert any("naive" in line for line in lines)
