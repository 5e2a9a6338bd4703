"""Pure parts of joining a cluster: the [ray] config, device placement order and capacity,
the driver's join arguments, the network settings of a device, the store address."""

from __future__ import annotations

import pytest

from dynaresize.cli import main
from dynaresize.config import ConfigError, load_config
from dynaresize.devices.cluster import join_kwargs
from dynaresize.devices.network import LOOPBACK, interface_of, loopback_env, network_env
from dynaresize.devices.placement import check_capacity, device_bundle, device_order
from dynaresize.devices.world import split_address


def test_ray_address_and_placement_are_validated() -> None:
    for good in ("", "auto", "10.0.0.1:6379", "head.example:6379", "[::1]:6379"):
        assert load_config(None, [f"ray.address='{good}'"]).ray.address == good
    for bad in ("10.0.0.1", "ray://10.0.0.1:10001", "host:0", "host:99999", ":6379"):
        with pytest.raises(ConfigError, match="ray.address"):
            load_config(None, [f"ray.address='{bad}'"])
    with pytest.raises(ConfigError, match="ray.placement"):
        load_config(None, ["ray.placement='ANYWHERE'"])


def test_a_joined_cluster_skips_this_machines_device_limit() -> None:
    with pytest.raises(ConfigError, match="this machine offers"):
        load_config(None, ["allocation.num_train_devices=500"])
    cfg = load_config(None, ["allocation.num_train_devices=500", "ray.address='10.0.0.1:6379'"])
    assert cfg.num_devices == 502


def test_address_flag_sets_ray_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--address", "10.0.0.1:6379", "--dry-run"]) == 0
    assert 'address = "10.0.0.1:6379"' in capsys.readouterr().out
    assert main(["train", "--address", "nowhere", "--dry-run"]) == 2
    assert "ray.address = 'nowhere'" in capsys.readouterr().err


def test_a_nodes_devices_get_adjacent_indices() -> None:
    # bundles 0..5 placed on nodes b, a, b, c, a, b: devices are b's bundles, then a's, then c's
    assert device_order(["b", "a", "b", "c", "a", "b"]) == [0, 2, 5, 1, 4, 3]
    assert device_order(["n"] * 4) == [0, 1, 2, 3]
    assert device_order([]) == []


def test_capacity_is_checked_before_waiting() -> None:
    gpu = device_bundle("cuda", 4)
    assert gpu == {"GPU": 1.0, "CPU": 1.0} and device_bundle("cpu", 2) == {"CPU": 2.0}
    check_capacity(8, gpu, "PACK", {"GPU": 8.0, "CPU": 64.0}, 1, "cluster")
    with pytest.raises(ConfigError, match="has 4 GPU in all; 8 devices need 8"):
        check_capacity(8, gpu, "PACK", {"GPU": 4.0, "CPU": 64.0}, 1, "cluster")
    with pytest.raises(ConfigError, match="needs 3 nodes"):
        check_capacity(3, gpu, "STRICT_SPREAD", {"GPU": 8.0, "CPU": 8.0}, 2, "cluster")


def test_join_arguments() -> None:
    assert join_kwargs("127.0.0.1:6379")["_node_ip_address"] == LOOPBACK  # a loopback cluster
    assert "_node_ip_address" not in join_kwargs("10.0.0.1:6379")  # Ray finds this machine's
    assert "_node_ip_address" not in join_kwargs("auto")


def test_localhost_is_loopback_without_a_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--address localhost:PORT` joins exactly as `127.0.0.1:PORT` does: the driver
    advertises loopback and the name is never resolved (no DNS)."""
    import socket

    from dynaresize.devices import cluster
    from dynaresize.devices.network import is_loopback

    for name in ("localhost", "LOCALHOST", "localhost.", "127.0.0.1", "::1", "127.1.2.3"):
        assert is_loopback(name) and interface_of(name) == "lo"
    for name in ("localhost.example", "myhost", "10.0.0.1", ""):
        assert not is_loopback(name)
    assert join_kwargs("localhost:6379") == join_kwargs("127.0.0.1:6379")
    assert join_kwargs("LocalHost:6379")["address"] == "127.0.0.1:6379"
    assert join_kwargs("localhost.example:6379")["address"] == "localhost.example:6379"
    connected = []

    def create_connection(address: tuple[str, int], timeout: float) -> socket.socket:
        connected.append(address)
        return socket.socket()

    monkeypatch.setattr(cluster.socket, "create_connection", create_connection)
    cluster.check_reachable("localhost:6379")
    assert connected == [("127.0.0.1", 6379)]


def test_collectives_use_the_interface_of_the_advertised_address() -> None:
    assert interface_of(LOOPBACK) == "lo"
    assert loopback_env()["GLOO_SOCKET_IFNAME"] == "lo"
    assert network_env(LOOPBACK)["NCCL_SOCKET_IFNAME"] == "lo"
    env = network_env("192.0.2.254")  # TEST-NET: no interface here holds it
    assert env == {"MASTER_ADDR": "192.0.2.254"}


def test_store_addresses() -> None:
    assert split_address("tcp://10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert split_address("tcp://[::1]:29500") == ("::1", 29500)
    with pytest.raises(ValueError):
        split_address("file:///tmp/store")


def test_the_store_listens_on_the_advertised_address_only() -> None:
    """A TCPStore opened by port binds `::` (every interface); ours serves a socket bound to
    the node's address, here loopback."""
    from pathlib import Path

    from dynaresize.devices.world import connect_store, open_store

    address = open_store(LOOPBACK)
    host, port = split_address(address)
    server = connect_store(address, 2, 10.0)
    client = connect_store(address, 2, 10.0)  # reserved socket used: now a client
    client.set("k", "v")
    assert server.get("k") == b"v"
    local = [line.split()[1] for t in ("/proc/net/tcp", "/proc/net/tcp6")
             for line in Path(t).read_text().splitlines()[1:]
             if line.split()[3] == "0A" and int(line.split()[1].rsplit(":", 1)[1], 16) == port]
    assert local == [f"0100007F:{port:04X}"]  # 127.0.0.1 alone, no wildcard


def test_an_address_where_nothing_listens_is_refused_at_once() -> None:
    import socket

    from dynaresize.devices.cluster import check_reachable

    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        s.listen(1)
        check_reachable(f"{LOOPBACK}:{s.getsockname()[1]}")  # something answers
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match="no Ray cluster answers there"):
        check_reachable(f"{LOOPBACK}:{port}")  # closed now
    check_reachable("auto")  # left to Ray


def test_device_processes_get_the_allocator_settings() -> None:
    """Bounded arenas and a fixed mmap threshold (docs/faults.md, memory), whatever the
    network: large freed tensors go back to the OS instead of staying in an arena."""
    from dynaresize.devices.network import MMAP_THRESHOLD_BYTES, base_env, loopback_env

    for env in (base_env(), loopback_env()):
        assert env["MALLOC_ARENA_MAX"] == "2"
        assert int(env["MALLOC_MMAP_THRESHOLD_"]) == MMAP_THRESHOLD_BYTES <= 4 * 2**20


def test_ray_imported_first_still_keeps_loopback_addresses() -> None:
    """Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, at import: a program that imported
    ray before dynaresize set it would have Ray rewrite a 127.0.0.1 GCS address to the
    machine's outward one (a join then retries for minutes). In a fresh interpreter."""
    import subprocess
    import sys

    code = ("import os; os.environ.pop('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER', None)\n"
            "from ray._private import ray_constants, services\n"
            "assert ray_constants.ENABLE_RAY_CLUSTER  # Linux's default\n"
            "os.environ['RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'] = '0'\n"
            "from dynaresize.devices.cluster import keep_loopback_addresses\n"
            "keep_loopback_addresses()\n"
            "print(ray_constants.ENABLE_RAY_CLUSTER, services.get_node_ip_address())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["False", "127.0.0.1"]
