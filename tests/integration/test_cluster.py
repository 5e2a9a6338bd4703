"""Joining a Ray cluster (`ray.address`): a 3-node cluster on loopback
(`ray.cluster_utils.Cluster`, every node advertising 127.0.0.1; the head holds no devices, like
a head node that only runs the GCS and the driver), `dynaresize train --set ray.address=...`
as a subprocess. Six devices span both worker nodes; a forced resize schedule writes the same
samples as the static run; losing a worker node mid-run loses nothing; nothing listens beyond
loopback. One cluster for the module (starting one costs ~6 s; each run ~30 s on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from run_views import sample_view
from test_loopback import LOOPBACK, descendants, listeners, socket_inodes

from dynaresize.core.rundir import read_jsonl
from dynaresize.devices.cluster import loopback_http

pytestmark = pytest.mark.cluster

BASE = ["run.steps=4", "run.staleness=1", "allocation.num_rollout_devices=2",
        "allocation.num_train_devices=4", "task.prompts_per_step=2",
        "task.samples_per_prompt=4", "task.max_new_tokens=8", "train.micro_batch_size=2",
        "controller.policy='static'", "output.progress='plain'", "rollout.slice_s=0.05",
        "rollout.max_running_requests=4", "output.save_model=false"]
SCHEDULE = ("resize.schedule=["
            "{step=1, at='start', move='train->rollout', num_devices=2},"
            "{step=2, at='rollout:0.3', move='rollout->train', num_devices=1}]")
RUN_TIMEOUT_S = 600
_drivers: list[subprocess.Popen[str]] = []
"""Every `dynaresize train` started here: one still running at teardown is killed."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    # a lost node is noticed in ~1.5 s; Ray's own memory monitor stays off (on a shared,
    # memory-tight test machine it kills device actors, a fault this test does not inject)
    system = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
              "health_check_initial_delay_ms": 0, "memory_monitor_refresh_ms": 0}
    with loopback_http():  # its processes send no HTTP off loopback (cloud metadata probes)
        c = Cluster(initialize_head=True, connect=False,
                    head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1",
                                    "include_dashboard": False, "_system_config": system})
    try:
        for _ in range(2):
            with loopback_http():
                c.add_node(wait=False, num_cpus=3, node_ip_address="127.0.0.1")
        c.wait_for_nodes(timeout=120)  # slow when the machine is loaded
        yield c
    finally:
        for proc in _drivers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        c.shutdown()


def train(cluster: Any, out: Path, *overrides: str) -> subprocess.Popen[str]:
    sets = [a for o in [*BASE, *overrides, f"ray.address='{cluster.address}'"]
            for a in ("--set", o)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    with open(log_of(out), "w") as log:  # a file, not a pipe: nothing blocks the driver
        proc = subprocess.Popen([sys.executable, "-m", "dynaresize", "train", "--out",
                                 str(out), *sets], env=env, stdout=log,
                                stderr=subprocess.STDOUT, text=True)
    _drivers.append(proc)
    return proc


def log_of(out: Path) -> Path:
    return out.parent / f"{out.name}.log"


def finish(proc: subprocess.Popen[str], out: Path) -> None:
    proc.wait(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, log_of(out).read_text()[-4000:]


@pytest.fixture(scope="module")
def static_run(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("static")
    finish(train(cluster, out), out)
    return out


def test_devices_span_nodes_and_a_forced_schedule_changes_no_sample(
        cluster: Any, static_run: Path, tmp_path: Path) -> None:
    summary = json.loads((static_run / "summary.json").read_text())
    workers = {n.node_id for n in cluster.list_all_nodes()} - {cluster.head_node.node_id}
    assert summary["nodes"] == 2 and set(summary["device_nodes"]) == workers
    nodes = summary["device_nodes"]
    assert nodes == sorted(nodes, key=nodes.index)  # a node's devices have adjacent indices
    events = read_jsonl(static_run / "events.jsonl")
    assert events and all(e["node"] == nodes[e["device"]] for e in events if e["device"] >= 0)

    proc = train(cluster, tmp_path, SCHEDULE)
    wait_for_first_step(proc, tmp_path)  # every node, the driver and all devices are up
    listening = project_listeners()
    assert len({pid for pid, _ in listening}) >= 11  # GCS, 3 raylets, driver, 6 devices
    assert {addr for _, addr in listening} <= LOOPBACK, sorted(listening)
    finish(proc, tmp_path)
    resized = json.loads((tmp_path / "summary.json").read_text())
    assert resized["num_resizes"] == 2 and resized["nodes"] == 2
    assert sample_view(tmp_path) == sample_view(static_run)
    assert resized["param_sha256"] == summary["param_sha256"]  # exact reduction: bitwise


def wait_for_first_step(proc: subprocess.Popen[str], out: Path) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    metrics = out / "metrics.jsonl"
    while not (metrics.exists() and read_jsonl(metrics)):
        assert proc.poll() is None, log_of(out).read_text()[-4000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)


def project_listeners() -> set[tuple[int, str]]:
    """(pid, address) of every LISTEN socket of this process's descendants: the cluster's
    GCS and raylets, the driver, the device actors and the world's store."""
    table = listeners()
    return {(pid, table[inode]) for pid in descendants(os.getpid())
            for inode in socket_inodes(pid) if inode in table}


def test_a_lost_node_loses_nothing(cluster: Any, static_run: Path, tmp_path: Path) -> None:
    proc = train(cluster, tmp_path, "run.checkpoint_every=1")
    wait_for_first_step(proc, tmp_path)  # mid-run from here
    node_of = {e["device"]: e["node"] for e in read_jsonl(tmp_path / "events.jsonl")
               if "node" in e}
    victim = node_of[max(node_of)]  # the node of the last training devices
    lost = {d for d, n in node_of.items() if n == victim}
    assert victim != cluster.head_node.node_id and 0 not in lost
    cluster.remove_node(next(n for n in cluster.list_all_nodes() if n.node_id == victim),
                        allow_graceful=False)
    finish(proc, tmp_path)

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {f["device"] for f in summary["faults"]} == lost
    # the node's devices are fenced together and one recovery covers them (a device left out
    # would be waited for in the rebuilt world until the process-group timeout)
    assert sum("recovery_s" in f for f in summary["faults"]) == 1
    assert sample_view(tmp_path) == sample_view(static_run)  # nothing lost or changed
    static = json.loads((static_run / "summary.json").read_text())
    assert summary["param_sha256"] == static["param_sha256"]  # checkpoint + replay: the same
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
