"""The twin's chaos campaign (`sim.chaos`): random deaths at 1024 simulated GPUs, and the
recovery bugs its trials found, each pinned as a trial of its own."""

from __future__ import annotations

import pytest

from dynaresize.sim.chaos import PHASES, Death, Trial, Variant, draw_trial
from dynaresize.sim.chaos_campaign import GPUS, ROLLOUT, STEPS, Campaign

TRAINERS = GPUS - ROLLOUT


@pytest.fixture(scope="module")
def campaign() -> Campaign:
    return Campaign()


def survived(row: dict) -> bool:
    assert row["finished"], row.get("error")
    assert (row["lost"], row["duplicated"], row["wrong_version"], row["changed"]) == (0, 0, 0, 0)
    assert row["metrics_ok"] and row["params_ok"]
    return bool(row["survived"])


def test_draws_are_seeded_and_valid() -> None:
    counts = {p: 100 for p in PHASES}
    a, b = draw_trial(7, lambda v: counts), draw_trial(7, lambda v: counts)
    assert a == b and 1 <= len(a.deaths) <= 3
    for seed in range(50):
        t = draw_trial(seed, lambda v: counts)
        first = t.deaths[0]
        assert first.phase in PHASES and first.phase != "recovery" and first.after is None
        if first.phase == "stream":
            assert t.variant.policy == "hysteresis"
        if first.phase == "checkpoint":
            assert t.variant.checkpoint_every >= 1
        if first.phase == "resize":
            assert t.variant.resize


def test_random_trials_survive(campaign: Campaign) -> None:
    rows = [campaign.trial(seed) for seed in range(3)]
    assert all(survived(r) for r in rows)
    assert all(r["killed"] for r in rows)


def test_engine_dies_while_loading_weights(campaign: Campaign) -> None:
    """Found by the campaign: a rollout device lost in `EnginePool.load_version` failed the
    run (no recovery hook there); now it is fenced and its share reruns elsewhere."""
    row = campaign.run(Trial(1, Variant("static", 1, 0), (Death("load_weights", 3, 0.001,
                                                                "caller"),)))
    assert row["killed"] and survived(row)


def test_death_inside_the_final_checkpoint_save(campaign: Campaign) -> None:
    """Found by the campaign: a rank lost inside the last step's save left the run without
    its final checkpoint; now the repair restores, replays and the save is taken again."""
    last_save = (STEPS - 1) * TRAINERS  # the first rank's call of the 4th save
    row = campaign.run(Trial(2, Variant("static", 1, 1), (Death("save_checkpoint", last_save,
                                                                0.001, "caller"),)))
    assert row["killed"] and row["final_checkpoint_ok"] and survived(row)


@pytest.mark.parametrize("victim", ["train", "rollout"])
def test_death_inside_the_world_rebuild(campaign: Campaign, victim: str) -> None:
    """Found by the campaign: a device lost during `Recovery.repair`'s world rebuild failed
    the run (also when the rollout had fenced it first); now the repair starts over."""
    deaths = (Death("train_step", TRAINERS + 5, 0.01, "caller"),
              Death("rebuild_world", 17, 0.01, victim, after=0))
    row = campaign.run(Trial(3, Variant("static", 0, 1), deaths))
    assert len(row["killed"]) == 2 and survived(row)
    assert row["num_recoveries"] == 2


def test_death_as_a_resize_stops_engines(campaign: Campaign) -> None:
    """Found by the campaign (trial 162): an idle rollout engine died unnoticed; the next
    resize stopped 424 engines and met the dead one in its export. Cancelling the resize's
    other ops cancelled the engines' serving tasks too (`stop_admission` awaited them
    unshielded): 122 requests were never finished and the run hung. Now the serving tasks
    survive, the rollback hands every stopped engine's requests back, and recovery drops the
    dead engine from the run."""
    deaths = (Death("stream", 178, 1.3314472206467773, "rollout"),
              Death("stream", 46, 1.9627091875224576, "train"))
    row = campaign.run(Trial(162, Variant("hysteresis", 1, 1), deaths))
    assert len(row["killed"]) == 2 and survived(row)


def test_rollout_engine_dies_during_a_resize_that_commits(campaign: Campaign) -> None:
    """Found by the campaign (trial 265): a rollout engine died while a train->rollout resize
    ran; the resize committed, but the repair rebuilt the world on the old allocation (the
    new one was installed after it) and failed. Now the target (minus the dead) is installed
    first."""
    row = campaign.run(Trial(265, Variant("static", 1, 1, "train->rollout"),
                             (Death("resize", 1084, 0.03636662463639939, "rollout"),)))
    assert row["killed"] and survived(row)


def test_device_dies_after_the_commit_of_a_resize(campaign: Campaign) -> None:
    """A device leaving training dies in `drop_trainer`, after the resize's commit (a documented
    limit before: the executor re-raised and the run failed). The new group is in charge: the
    target allocation is installed, the dead device fenced, the world rebuilt."""
    row = campaign.run(Trial(4, Variant("static", 1, 1, "train->rollout"),
                             (Death("drop_trainer", 3, 0.0001, "caller"),)))
    assert row["killed"] and survived(row)


def test_rollout_death_in_a_streamed_step_reruns_it_plainly(campaign: Campaign) -> None:
    """Found live (bench/chaos_live.py trial 0): a rollout engine died while a step streamed
    its training; the world rebuild at the boundary dropped the trainers' held gradients and
    the streamed finish failed. The twin now drops them too (`SimDevice.rebuild_world`);
    the train loop reruns a step the plain way after any repair since it began."""
    row = campaign.run(Trial(5, Variant("hysteresis", 1, 0),
                             (Death("train_accumulate", 3, 0.001, "rollout"),)))
    assert row["killed"] and survived(row)


def test_trainers_dying_in_the_repair_before_a_resize_at_staleness_2(
        campaign: Campaign) -> None:
    """Found by the campaign at staleness 2: a rollout engine died, and two trainers died in
    the repair the step-1 resize runs first; its plan, made before the repair, still resharded
    from them and the run failed. Now the repair comes first and the plan sees the
    survivors."""
    deaths = (Death("rollout", 62, 1.4854, "train"), Death("rollout", 106, 0.8778, "train"),
              Death("rollout", 27, 0.4898, "rollout"))
    row = campaign.run(Trial(250, Variant("static", 2, 2, "rollout->train"), deaths))
    assert len(row["killed"]) == 3 and survived(row)


@pytest.mark.parametrize("nth", [0, 5])
def test_a_device_dying_inside_the_commit_leaves_the_others_committed(
        campaign: Campaign, nth: int) -> None:
    """Found live (chaos_live --hangs 0.5, builtin seed 61): a device joining training died
    inside the resize's commit, a local swap on every member, after the others had swapped.
    The executor rolled back all the same, and recovery restored the new group's shards into
    the old group's trainers. The twin's commit was a collective failing on every member, and
    its ranks did not check the layout their kept state was sharded for; both are as live now,
    and a commit some members made counts as made (`ResizeExecutor._commit`)."""
    row = campaign.run(Trial(7, Variant("static", 1, 0, "rollout->train"),
                             (Death("commit_train_group", nth, 0.001, "caller"),)))
    assert row["killed"] and survived(row)


def test_hangs_are_drawn_from_their_own_stream() -> None:
    """`hangs` turns deaths into freezes without changing what else a trial draws, so a
    campaign without hangs is the same campaign as before."""
    counts = {p: 100 for p in PHASES}
    for seed in range(40):
        plain = draw_trial(seed, lambda v: counts)
        assert all(d.how == "kill" for d in plain.deaths)
        assert draw_trial(seed, lambda v: counts, 0.0) == plain
        frozen = draw_trial(seed, lambda v: counts, 1.0)
        assert frozen.variant == plain.variant
        assert [d.how for d in frozen.deaths] == ["hang"] * len(plain.deaths)
        assert [(d.phase, d.nth, d.victim) for d in frozen.deaths] == \
            [(d.phase, d.nth, d.victim) for d in plain.deaths]


@pytest.mark.parametrize("phase,nth", [("train_step", TRAINERS + 5), ("reshard", 3),
                                       ("run_rollout", 40), ("publish_weights", 7)])
def test_a_frozen_device_is_found_and_the_run_survives(phase: str, nth: int) -> None:
    """A freeze in a collective (train step, reshard, publish) or a rollout: the device and
    its group wait, the watchdog's bound later it is killed, recovery keeps every record."""
    campaign = Campaign(hangs=1.0)
    variant = Variant("static", 1, 0, "rollout->train" if phase == "reshard" else "")
    row = campaign.run(Trial(4, variant, (Death(phase, nth, 0.01, "caller", how="hang"),)))
    assert row["killed"] and survived(row)
