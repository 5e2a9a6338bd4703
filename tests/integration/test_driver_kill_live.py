"""Driver death on the real path: `kill -9` of a `dynaresize train` driver (its own session)
after a finished step, then `--resume`: the same sample records, each once, every step's
metrics once, the same param_sha256 as an uninterrupted run, and no process of the dead
driver left behind (`dynaresize.app.driver_kill`; bench/driver_kill.py runs 5 at random)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynaresize.app.driver_kill import start, train_cmd, trial

pytestmark = pytest.mark.ray

SETS = ["run.steps=20", "run.checkpoint_every=2", "task.prompts_per_step=4",
        "task.samples_per_prompt=4", "task.max_new_tokens=12", "train.micro_batch_size=4",
        "output.progress='plain'", "output.save_model=false", "controller.policy='static'"]


def test_driver_killed_after_a_checkpoint_resumes_to_the_same_run(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    assert start(train_cmd(SETS, reference), tmp_path / "reference.log").wait() == 0
    # killed once step 3 is logged and step 2's checkpoint is complete: checkpoints are written
    # beside the next steps, which take 0.1-0.4 s here, so the newest complete one may lag the
    # metrics by a few steps; 20 steps leave the kill room to land before the run ends
    row = trial(SETS, 20, tmp_path / "cut", reference, after_steps=3, delay_s=0.1,
                after_checkpoint=2)
    assert row["killed"] and row["resume_rc"] == 0, (tmp_path / "cut.log").read_text()[-2000:]
    assert row["steps_at_kill"] >= 3 and row["resumed_from"] % 2 == 0 and row["resumed_from"] >= 2
    assert row["recomputed_steps"] == row["steps_at_kill"] - row["resumed_from"] >= 0
    assert (row["lost"], row["duplicated"], row["changed"], row["duplicated_metrics"]) == \
        (0, 0, 0, 0)
    assert row["metrics_ok"] and row["params_equal"] and row["orphans"] == 0
