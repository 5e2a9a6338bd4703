"""Storage faults: a checkpoint truncated or corrupted, a garbage `latest`, a disk full
during a save. The run names the file, resumes from the previous complete checkpoint or stops
with exit 2, and no checkpoint that was complete before is lost."""

from __future__ import annotations

import errno
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from dynaresize.orchestrator.checkpoint_files import (
    CheckpointState,
    CheckpointWriteError,
    checkpoint_dir,
    manifest,
    read_checkpoint,
    read_latest,
)


def fake_checkpoint(run: Path, k: int) -> Path:
    """A complete checkpoint after k steps as the Checkpointer writes it."""
    path = checkpoint_dir(run, k)
    (path / "train").mkdir(parents=True)
    (path / "train" / "__0_0.distcp").write_bytes(bytes(range(256)) * (k + 1))
    (path / f"weights-v{k - 1}.pt").write_bytes(b"w" * 100)
    state = CheckpointState(k, 0, 1, ["rollout", "train"], {str(k - 1): f"weights-v{k - 1}.pt"})
    state.files = manifest(path)
    (path / "state.json").write_text(json.dumps(asdict(state)))
    (run / "checkpoints" / "latest").write_text(path.name + "\n")
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    for k in (1, 2, 3):
        fake_checkpoint(tmp_path, k)
    return tmp_path


def resume(run: Path) -> tuple[Path, list[str]]:
    warnings: list[str] = []
    path, state = read_latest(run, warnings.append)
    assert state.num_steps == int(path.name.split("-")[1])
    return path, warnings


def test_latest_complete(run: Path) -> None:
    path, warnings = resume(run)
    assert path.name == "step-000003" and not warnings


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "state"])
def test_damaged_latest_falls_back_to_the_previous(run: Path, damage: str) -> None:
    shard = run / "checkpoints" / "step-000003" / "train" / "__0_0.distcp"
    data = shard.read_bytes()
    if damage == "truncate":
        shard.write_bytes(data[:100])
    elif damage == "flip":
        shard.write_bytes(data[:10] + bytes([data[10] ^ 1]) + data[11:])
    elif damage == "delete":
        shard.unlink()
    else:
        (shard.parents[1] / "state.json").write_text('{"num_steps": 3, "se')
    path, warnings = resume(run)
    assert path.name == "step-000002"
    named = "state.json" if damage == "state" else "__0_0.distcp"
    assert len(warnings) == 1 and named in warnings[0] and "step-000002" in warnings[0]
    assert {"truncate": "truncated", "flip": "sha256", "delete": "missing",
            "state": "unreadable"}[damage] in warnings[0]
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == \
        ["step-000001", "step-000002", "step-000003"]  # nothing deleted


@pytest.mark.parametrize("text", ["garbage\n", "../../etc\n", "step-000009\n", "\xff\xfe"])
def test_corrupt_latest_never_loses_older_checkpoints(run: Path, text: str) -> None:
    (run / "checkpoints" / "latest").write_text(text, errors="surrogateescape")
    path, warnings = resume(run)
    assert path.name == "step-000003" and "latest" in warnings[0]


def test_nothing_complete_is_an_error_naming_the_file(run: Path) -> None:
    for k in (1, 2, 3):
        (checkpoint_dir(run, k) / f"weights-v{k - 1}.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"weights-v0\.pt: 0 bytes"):
        read_latest(run)


def test_resume_from_nothing_complete_exits_2(run: Path, capsys: pytest.CaptureFixture
                                              ) -> None:
    from dynaresize.cli import main

    for k in (1, 2, 3):
        (checkpoint_dir(run, k) / "state.json").unlink()
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "state.json" in err and "Traceback" not in err


# ---------------------------------------------------------------- disk full during a save (twin)

def twin_config() -> Any:
    from dynaresize.sim.chaos import Variant
    from dynaresize.sim.chaos_campaign import variant_config

    return variant_config(Variant("static", 1, 1))


def disk_full(path: Any) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", str(path))


@pytest.mark.parametrize("where", ["weights", "dcp"])
def test_disk_full_during_a_save_stops_and_keeps_the_last(tmp_path: Path, where: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The 3rd save (after step 2) meets a full disk: in the weight file written in the
    background, or in a rank's DCP shards. The run stops with CheckpointWriteError naming the
    file; `latest` and the checkpoints before are untouched and resumable."""
    from dynaresize.sim.chaos_campaign import COSTS, WORKLOAD
    from dynaresize.sim.device import SimDevice
    from dynaresize.sim.harness import SimWeightIO, run_config

    if where == "weights":
        orig_save = SimWeightIO.save

        def save(handle: Any, path: Path) -> None:
            if path.name == "weights-v2.pt":
                path.write_text("partial")
                raise disk_full(path)
            orig_save(handle, path)

        monkeypatch.setattr(SimWeightIO, "save", staticmethod(save))
    else:
        orig_dcp = SimDevice.save_checkpoint

        async def save_checkpoint(self: SimDevice, path: str) -> dict[str, float]:
            if "step-000003" in path and self.index == 1000:
                raise disk_full(f"{path}/__{self.index}_0.distcp")
            return await orig_dcp(self, path)

        monkeypatch.setattr(SimDevice, "save_checkpoint", save_checkpoint)
    with pytest.raises(CheckpointWriteError) as info:
        run_config(twin_config(), WORKLOAD, COSTS, out_dir=tmp_path)
    message = str(info.value)
    assert ("weights-v2.pt" if where == "weights" else "__1000_0.distcp") in message
    assert "No space left on device" in message and "step-000002" in message
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000002"
    for k in (1, 2):  # complete (the twin keeps its DCP shards in memory: no train/ files)
        state = json.loads((checkpoint_dir(tmp_path, k) / "state.json").read_text())
        assert state["num_steps"] == k
    assert not (checkpoint_dir(tmp_path, 3) / "state.json").exists()


def test_a_run_failing_right_after_a_checkpoint_step_still_completes_that_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's part of a checkpoint (weight files, state.json, `latest`) runs in the
    background after the trainers saved their shards; a run that fails meanwhile used to
    drop it, so `latest` stayed on the checkpoint before and --resume redid those steps."""
    import asyncio

    import dynaresize.orchestrator.checkpoint as checkpoint_module
    from dynaresize.config import to_toml, validate
    from dynaresize.core.rundir import RunDir
    from dynaresize.orchestrator import Orchestrator
    from dynaresize.orchestrator.checkpoint import CheckpointTarget
    from dynaresize.sim.clock import VirtualClock
    from dynaresize.sim.costs import get_cost_model
    from dynaresize.sim.device import SimDevice, make_devices
    from dynaresize.sim.faults import SimProcesses
    from dynaresize.sim.harness import SimPromptSource, SimWeightIO, sim_config
    from dynaresize.sim.workloads import get_workload

    save = SimDevice.save_checkpoint

    async def save_with_dir(device: SimDevice, path: str) -> Any:
        Path(path).mkdir(parents=True, exist_ok=True)  # the twin writes no shard files
        return await save(device, path)

    async def slow_file_work(fn: Any, *args: Any) -> Any:  # live: seconds of torch.save
        await asyncio.sleep(5.0)
        return fn(*args)

    class Stop(RuntimeError):
        pass

    def on_step(record: dict[str, Any]) -> None:
        if record["step"] == 3:  # the checkpoint after step 3 (4 steps) was just saved
            raise Stop("the run fails right after a checkpoint step")

    monkeypatch.setattr(SimDevice, "save_checkpoint", save_with_dir)
    monkeypatch.setattr(checkpoint_module.asyncio, "to_thread", slow_file_work)
    costs = get_cost_model("h100-7b")
    workload = get_workload("dapo-7b", seed=0, prompts_per_step=16, samples_per_prompt=4)
    cfg = sim_config(workload, 5, 3, 6, 1, 0, costs)
    cfg.run.checkpoint_every = 2
    validate(cfg, check_machine=False)
    clock = VirtualClock()
    rundir = RunDir(tmp_path)
    rundir.write_config(to_toml(cfg))
    orch = Orchestrator(cfg, make_devices(cfg.num_devices, 5, costs, workload, clock,
                                          SimProcesses()),
                        clock, SimPromptSource(workload), rundir, on_step=on_step,
                        checkpoints=CheckpointTarget(tmp_path, 2, SimWeightIO()))
    with pytest.raises(Stop):
        clock.run(orch.run())
    rundir.close()
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000004"
    assert (tmp_path / "checkpoints" / "step-000004" / "state.json").is_file()


def test_filter_rates_in_the_state_are_optional_and_checked(run: Path) -> None:
    """state.json keeps dynamic sampling's exact filter rates; one written before it did
    has none (the resume reads them from samples.jsonl); a bad entry names the field."""
    state_file = checkpoint_dir(run, 3) / "state.json"
    data = json.loads(state_file.read_text())
    data.pop("filter_rates")
    state_file.write_text(json.dumps(data))
    assert read_latest(run)[1].filter_rates == {}
    data["filter_rates"] = {"1": 0.25, "2": 1.0}
    state_file.write_text(json.dumps(data))
    assert read_latest(run)[1].filter_rates == {"1": 0.25, "2": 1.0}
    for bad in ({"1": 1.5}, {"x": 0.5}, [0.5], {"1": True}):
        data["filter_rates"] = bad
        state_file.write_text(json.dumps(data))
        with pytest.raises(ValueError, match="field 'filter_rates'"):
            read_checkpoint(checkpoint_dir(run, 3))
