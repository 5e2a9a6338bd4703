"""Which address and interface a device process talks on (no torch, no Ray).

The local default keeps everything on loopback (design §6): Ray nodes advertise 127.0.0.1, gloo
and NCCL use the `lo` interface, the world's rendezvous store listens on 127.0.0.1. In a
joined cluster every device uses the address its Ray node advertises, and the interface that
holds that address: nothing ever binds a wildcard address.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

LOOPBACK = "127.0.0.1"

_SIOCGIFADDR = 0x8915
"""Linux ioctl: the IPv4 address of an interface."""


MMAP_THRESHOLD_BYTES = 2**20
"""`MALLOC_MMAP_THRESHOLD_`: every allocation of at least this size is its own mapping."""


def base_env() -> dict[str, str]:
    """Environment of every device process, whatever the network. `MALLOC_ARENA_MAX`: glibc
    gives each of a Ray worker's ~30 threads an arena (up to 8 per core), and the memory
    freed in one is not reused by the others. `MALLOC_MMAP_THRESHOLD_` (fixed, 1 MiB): glibc
    otherwise raises it up to 32 MiB as it frees large blocks, after which a layer's tensors
    (1-5 MB) come from the arenas and stay resident once freed (a backward's gradients, a
    received state dict: ~0.7 GB measured per training step); mapped, they go back to the
    OS when freed (docs/faults.md, memory)."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2",
            "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES)}


def is_localhost_name(host: str) -> bool:
    """Whether `host` is the name localhost (any case, a trailing dot allowed): a loopback
    address wherever it is resolved (RFC 6761 §6.3), so it is never looked up."""
    return host.lower() in ("localhost", "localhost.")


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback IP address or the name localhost (no other name is
    resolved: False)."""
    if is_localhost_name(host):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface `name`, None if it has none (Linux)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_of(ip: str) -> str | None:
    """The local network interface holding IPv4 address `ip` ('lo' for loopback), or None."""
    if is_loopback(ip):
        return "lo"
    for _, name in socket.if_nameindex():
        if interface_address(name) == ip:
            return name
    return None


def network_env(ip: str) -> dict[str, str]:
    """gloo / NCCL / tensorpipe settings for a process whose node advertises `ip`: the sockets
    of collectives bind the interface holding `ip` (gloo would otherwise resolve the host
    name, which may be any interface)."""
    env = {"MASTER_ADDR": ip}
    name = interface_of(ip)
    if name is not None:
        env.update(GLOO_SOCKET_IFNAME=name, NCCL_SOCKET_IFNAME=name, TP_SOCKET_IFNAME=name)
    return env


def loopback_env() -> dict[str, str]:
    """Environment that keeps gloo / NCCL / Ray traffic on loopback (design §6)."""
    return {**base_env(), **network_env(LOOPBACK)}
