"""Every path that started a local Ray cluster ends it, on an error or Ctrl-C too: starting it
(`ensure_ray`), `dynaresize train` (`run_training`), the bench scripts. No Ray is started:
`ray.init` / `ensure_ray` and `ray.shutdown` are stand-ins that record their calls."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from dynaresize.config import load_config
from dynaresize.devices import cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


@pytest.fixture
def shutdowns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`ray.shutdown` calls; the environment `ensure_ray` sets is restored after the test."""
    import ray

    calls: list[str] = []
    for name in ("RAY_USAGE_STATS_ENABLED", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda *a, **k: calls.append("shutdown"))
    return calls


def we_start_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ensure_ray` (wherever it was imported from) 'starts' a local cluster."""
    from dynaresize.devices import ray_device

    for module in (cluster, ray_device):
        monkeypatch.setattr(module, "ensure_ray", lambda *a, **k: True)


def test_a_local_cluster_interrupted_while_it_starts_is_shut_down(
        shutdowns: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def init(**kwargs: Any) -> None:
        raise KeyboardInterrupt  # Ctrl-C once the GCS and raylet run, before init returns

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(KeyboardInterrupt):
        cluster.ensure_ray(num_cpus=2)
    assert shutdowns == ["shutdown"]


def test_ray_session_ends_the_cluster_it_started_on_an_error(
        shutdowns: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    we_start_a_cluster(monkeypatch)
    with pytest.raises(KeyboardInterrupt), cluster.ray_session():
        raise KeyboardInterrupt
    assert shutdowns == ["shutdown"]
    monkeypatch.setattr(cluster, "ensure_ray", lambda *a, **k: False)  # joined: not ours
    with pytest.raises(RuntimeError), cluster.ray_session("127.0.0.1:6379"):
        raise RuntimeError
    assert shutdowns == ["shutdown"]


class BrokenPool:
    """A pool whose run is interrupted and whose shutdown then fails too."""

    num_devices = 4

    @property
    def node_of(self) -> dict[int, str]:
        raise KeyboardInterrupt

    def shutdown(self, wait_s: float = 0.0) -> None:
        raise RuntimeError("the pool's shutdown failed")


def test_train_ends_its_cluster_when_the_pool_shutdown_fails(
        shutdowns: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from dynaresize.app import runner

    monkeypatch.setattr(runner, "_start_ray", lambda *a: True)
    monkeypatch.setattr(runner, "_new_pool", lambda cfg: BrokenPool())
    cfg = load_config(None, ["output.progress='plain'"])
    with pytest.raises(RuntimeError, match="the pool's shutdown failed"):
        runner.run_training(cfg, None)
    assert shutdowns == ["shutdown"]


def no_pool(num_devices: int) -> Any:
    raise RuntimeError("no placement for the devices")


def test_bench_faults_ends_its_cluster_when_the_pool_fails(
        shutdowns: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import faults

    from dynaresize.devices import pool

    we_start_a_cluster(monkeypatch)
    monkeypatch.setattr(pool, "DevicePool", no_pool)
    with pytest.raises(RuntimeError, match="no placement"):
        faults.main(["--out", str(tmp_path)])
    assert shutdowns == ["shutdown"]


def test_bench_chaos_live_ends_its_cluster_when_the_pool_fails(
        shutdowns: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import chaos_live

    from dynaresize.devices import pool

    we_start_a_cluster(monkeypatch)
    monkeypatch.setattr(pool, "DevicePool", no_pool)
    args = argparse.Namespace(out=str(tmp_path), engine="builtin", set=[], first_seed=0,
                              trials=1, json=None, mode="kill", hangs=0.0)
    with pytest.raises(RuntimeError, match="no placement"):
        chaos_live.campaign(args)
    assert shutdowns == ["shutdown"]
