"""Driver death trials: `kill -9` of a `dynaresize train` driver at a random point, then
`dynaresize train --resume` from its run directory (`bench/driver_kill.py`, the live test).

A trial starts the driver in a session of its own (`start_new_session`), so every process it
starts (the local Ray cluster's GCS and raylet, the device actors) shares that session id.
It SIGKILLs the driver once `metrics.jsonl` holds a drawn number of steps plus a drawn delay,
waits (bounded) for the session's other processes to go (Ray fate-shares the processes of a
cluster the driver started: its raylet and GCS die with it, their workers with them), counts
what is left as orphans and ends those by pid. Then it resumes and compares the run with an
uninterrupted one: the same sample records, each once, every step's metrics once, the same
`param_sha256`, and the steps recomputed (done before the kill, after the checkpoint the
resume loaded) at most those since the last complete checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dynaresize.core.rundir import read_jsonl


def train_cmd(sets: list[str], out: Path, resume: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "dynaresize", "train"]
    if resume:
        return [*cmd, "--resume", str(out)]
    return [*cmd, *[a for s in sets for a in ("--set", s)], "--out", str(out)]


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(["nice", "-n", "10", *cmd], stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name: state, ppid, pgrp, session,
    ...) of every process alive now."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        yield int(entry), stat.rsplit(")", 1)[1].split()


def session_pids(sid: int) -> list[int]:
    """Live processes (not zombies) of session `sid`, from /proc."""
    return [pid for pid, fields in proc_stats() if fields[0] != "Z" and int(fields[3]) == sid]


def num_lines(file: Path) -> int:
    try:
        return file.read_bytes().count(b"\n")
    except OSError:
        return 0


def kill_pids(pids: list[int]) -> None:
    """SIGKILL each of `pids` (ours, by id); one already gone is skipped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def end_session(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """End a driver started in its own session (`start`) and every process left in that
    session: SIGTERM to the driver's group, then after `grace_s` SIGKILL by pid."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    kill_pids([proc.pid, *session_pids(proc.pid)])
    proc.wait()


def run_bounded(proc: subprocess.Popen[bytes], timeout_s: float) -> int | str:
    """`proc`'s exit code, or "timeout" once it ran `timeout_s` (then its session is ended)."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_session(proc)
        return "timeout"


def kill_driver(proc: subprocess.Popen[bytes], out: Path, after_steps: int, delay_s: float,
                timeout_s: float, after_checkpoint: int = 0) -> dict[str, Any]:
    """SIGKILL the driver `delay_s` after `after_steps` metric lines exist and a complete
    checkpoint of at least `after_checkpoint` steps is on disk (checkpoints are written beside
    the next step, so a step's metric line alone does not say its checkpoint is complete);
    then wait for its session to empty (<= 120 s), end what is left (orphans) by pid."""
    deadline = time.monotonic() + timeout_s

    def waiting() -> bool:
        return num_lines(out / "metrics.jsonl") < after_steps or \
            (after_checkpoint > 0 and latest_complete(out) < after_checkpoint)

    while waiting() and proc.poll() is None:
        if time.monotonic() > deadline:
            end_session(proc)  # the driver and its cluster: no orphan run
            raise TimeoutError(f"{out}: {after_steps} steps (a checkpoint of "
                               f"{after_checkpoint}) not reached in {timeout_s} s")
        time.sleep(0.05)
    time.sleep(delay_s)
    if proc.poll() is not None:
        return {"killed": False, "steps_at_kill": num_lines(out / "metrics.jsonl")}
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    steps_at_kill = num_lines(out / "metrics.jsonl")
    sid, t0 = proc.pid, time.monotonic()
    while session_pids(sid) and time.monotonic() - t0 < 120:
        time.sleep(0.5)
    orphans = session_pids(sid)
    names = [Path(f"/proc/{p}/cmdline").read_bytes()[:80].decode(errors="replace")
             .replace("\0", " ") for p in orphans if Path(f"/proc/{p}").exists()]
    kill_pids(orphans)  # ours: end them so the machine stays clean
    return {"killed": True, "steps_at_kill": steps_at_kill, "orphans": len(orphans),
            "orphan_names": names, "session_empty_s": round(time.monotonic() - t0, 1)}


def compare(run: Path, reference: Path, steps: int) -> dict[str, Any]:
    """A resumed run against the uninterrupted one."""
    def view(path: Path) -> tuple[dict[Any, Any], int]:
        records = read_jsonl(path / "samples.jsonl")
        return {(s["step"], s["prompt"], s["sample"]): (s["version"], s["tokens_sha256"])
                for s in records}, len(records)

    got, num_got = view(run)
    ref, _ = view(reference)
    metric_steps = [m["step"] for m in read_jsonl(run / "metrics.jsonl")]
    sha = [json.loads((p / "summary.json").read_text()).get("param_sha256")
           for p in (run, reference)]
    return {"lost": len(set(ref) - set(got)), "duplicated": num_got - len(got),
            "changed": sum(got[k] != ref[k] for k in set(got) & set(ref)),
            "duplicated_metrics": len(metric_steps) - len(set(metric_steps)),
            "metrics_ok": metric_steps == list(range(steps)), "params_equal": sha[0] == sha[1]}


def latest_complete(out: Path) -> int:
    from dynaresize.orchestrator.checkpoint_files import read_latest

    try:
        return read_latest(out)[1].num_steps
    except ValueError:
        return 0


def _resume(sets: list[str], out: Path, steps: int, resumed_from: int, log: Path,
            timeout_s: float) -> int | str:
    """`dynaresize train --resume out`'s exit code ("timeout" if it ran past `timeout_s`, at
    least 60 s). A run whose checkpoint holds every step and whose summary.json exists (the
    driver finished before the kill) has nothing to resume: 0 (a resume would exit 2)."""
    if resumed_from >= steps:
        return 0 if (out / "summary.json").is_file() else "done, no summary.json"
    return run_bounded(start(train_cmd(sets, out, resume=True), log), max(60.0, timeout_s))


def trial(sets: list[str], steps: int, out: Path, reference: Path, after_steps: int,
          delay_s: float, timeout_s: float = 540.0, after_checkpoint: int = 0
          ) -> dict[str, Any]:
    """One driver-kill trial (module docstring); `reference`: the uninterrupted run;
    `after_checkpoint`: kill only once a checkpoint of that many steps is complete."""
    log = out.with_suffix(".log")
    t0 = time.monotonic()
    row: dict[str, Any] = {"after_steps": after_steps, "delay_s": round(delay_s, 2)}
    row.update(kill_driver(start(train_cmd(sets, out), log), out, after_steps, delay_s,
                           timeout_s, after_checkpoint))
    row["resumed_from"] = resumed_from = latest_complete(out)
    row["recomputed_steps"] = max(0, row["steps_at_kill"] - resumed_from)
    row["resume_rc"] = _resume(sets, out, steps, resumed_from, log,
                               timeout_s - (time.monotonic() - t0))
    if row["resume_rc"] == 0:
        row.update(compare(out, reference, steps))
    row["survived"] = row["resume_rc"] == 0 and row.get("metrics_ok", False) and \
        row["lost"] == row["duplicated"] == row["changed"] == 0 and row["params_equal"] \
        and row.get("orphans", 0) == 0
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row
