"""Starting or joining the Ray cluster, and what a process knows about its node.

The local default (`ray.address = ""`) starts a single-node cluster whose every server listens
on 127.0.0.1 (design §6). `ray.address = "HOST:PORT"` (or `--address`) joins a running cluster:
its nodes advertise the addresses they were started with (`ray start --node-ip-address`), and
the driver takes this machine's address as Ray detects it, unless the cluster's GCS is on a
loopback address: then the whole cluster is on this machine and the driver advertises
127.0.0.1 too (a loopback test cluster, `ray.cluster_utils.Cluster`). `localhost:PORT` is
`127.0.0.1:PORT` (`canonical_address`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dynaresize.config.schema import ConfigError
from dynaresize.devices.network import LOOPBACK, is_localhost_name, is_loopback, loopback_env


def canonical_address(address: str) -> str:
    """`address` ('HOST:PORT' or 'auto') with the host name localhost as 127.0.0.1: joining
    'localhost:PORT' is joining '127.0.0.1:PORT' (nothing resolves the name)."""
    host, sep, port = address.rpartition(":")
    return f"{LOOPBACK}:{port}" if sep and is_localhost_name(host.strip("[]")) else address


def join_kwargs(address: str) -> dict[str, Any]:
    """`ray.init` arguments that join the cluster at `address` ('HOST:PORT' or 'auto')."""
    address = canonical_address(address)
    kwargs: dict[str, Any] = {"address": address, "logging_level": "warning",
                              "log_to_driver": False}
    host = address.rpartition(":")[0].strip("[]")
    if is_loopback(host):
        kwargs["_node_ip_address"] = LOOPBACK
    return kwargs


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """ConfigError unless something accepts a TCP connection at `address` ('HOST:PORT'; 'auto'
    is left to Ray): `ray.init` would retry an address where nothing listens for minutes."""
    if address == "auto":
        return
    host, _, port = canonical_address(address).rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError("ray.address", address,
                          f"no Ray cluster answers there ({exc}); start one with `ray start "
                          "--head`, or leave ray.address empty for a local cluster") from None


DEAD_PROXY = "http://127.0.0.1:9"
"""A loopback port where nothing listens (discard): HTTP sent there fails at once."""


def keep_loopback_addresses() -> None:
    """Make Ray read `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER` as set now, also when it was imported
    before (its constant is read at import): with the constant true, Ray rewrites a
    127.0.0.1 or localhost GCS address to this machine's outward address and retries that
    address for minutes."""
    from ray._private import ray_constants

    value = os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0").lower()
    ray_constants.ENABLE_RAY_CLUSTER = value in ("1", "true")  # Ray's reading (`env_bool`)


@contextmanager
def loopback_http() -> Iterator[None]:
    """While a local cluster's processes start (they keep this environment): HTTP through
    `requests`/urllib to anything but loopback goes to `DEAD_PROXY` and fails there. Ray's
    dashboard head probes cloud metadata at start (169.254.169.254, a DNS lookup of
    metadata.google.internal) whatever RAY_USAGE_STATS_ENABLED says; nothing of a local run
    needs the outside (design §6). Ray's own gRPC ignores these variables."""
    keys = {name: DEAD_PROXY for name in ("http_proxy", "HTTP_PROXY", "https_proxy",
                                          "HTTPS_PROXY")}
    keys.update(no_proxy="127.0.0.1,localhost,::1", NO_PROXY="127.0.0.1,localhost,::1")
    before = {name: os.environ.get(name) for name in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Join the cluster at `address`, or start a local one on loopback. True if we started it
    (then the caller shuts it down)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return False
    keep_loopback_addresses()
    if address:
        check_reachable(address)
        ray.init(**join_kwargs(address))
        return False
    # address="local": always a new cluster of our own, never one another user (or RAY_ADDRESS)
    # left running on this machine, which `ray.init()` would otherwise join
    try:
        with loopback_http():
            ray.init(address="local", _node_ip_address=LOOPBACK, include_dashboard=False,
                     num_cpus=num_cpus,
                     logging_level="warning", log_to_driver=False,
                     runtime_env={"env_vars": loopback_env()})
    except BaseException:  # e.g. Ctrl-C while it starts: end the processes it started
        ray.shutdown()
        raise
    return True


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[bool]:
    """`ensure_ray` for a `with` block: a cluster it started is shut down when the block
    ends, on an exception or Ctrl-C too. Yields whether it started one."""
    started = ensure_ray(address, num_cpus)
    try:
        yield started
    finally:
        if started:
            import ray

            ray.shutdown()


@dataclass(frozen=True)
class NodeInfo:
    """Where a process runs: its Ray node, the address that node advertises, its pid."""

    node_id: str
    node_ip: str
    pid: int
    parent_pid: int
    """For a Ray worker (a device actor): its node's raylet, which started it. A worker
    outlives a killed raylet for a moment; its node is lost from the first instant."""


def this_node() -> NodeInfo:
    """The calling process's node (a connected driver or a Ray worker)."""
    import ray

    return NodeInfo(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(),
                    os.getpid(), os.getppid())


def dead_nodes() -> set[str]:
    """Ids of the nodes the cluster's GCS reports dead."""
    import ray

    return {n["NodeID"] for n in ray.nodes() if not n.get("Alive", False)}
