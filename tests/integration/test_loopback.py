"""Nothing the project starts listens beyond loopback: after a live run (the session's Ray
cluster and device actors, with their gloo world, still up), every LISTEN socket owned by the
test process or any of its descendants (Ray's GCS, raylet, workers, the device actors) is bound
to 127.0.0.1 or ::1."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dynaresize.config import load_config

pytestmark = pytest.mark.ray

LISTEN = "0A"
LOOPBACK = {"127.0.0.1", "::1"}


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def address(hex_addr: str) -> str:
    import ipaddress

    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    ip = ipaddress.IPv6Address(words)
    return str(ip.ipv4_mapped or ip)


def listeners() -> dict[str, str]:
    """inode → local address of every LISTEN TCP socket on the machine."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                out[fields[9]] = address(fields[1].split(":")[0])
    return out


def test_every_project_listener_is_loopback(device_pool: Any, tmp_path: Path) -> None:
    from dynaresize.app.runner import run_training

    pool = device_pool(4)
    cfg = load_config(None, ["run.steps=1", "task.prompts_per_step=2",
                             "task.samples_per_prompt=2", "task.max_new_tokens=4",
                             "train.micro_batch_size=2", "output.progress='plain'"],
                      check_machine=False)
    run_training(cfg, tmp_path, pool=pool)
    pids = descendants(os.getpid()) | set(pool.pids)
    assert set(pool.pids) <= descendants(os.getpid())   # the actors are found by the walk
    table = listeners()
    owned = {inode: pid for pid in pids for inode in socket_inodes(pid) if inode in table}
    assert len({owned[i] for i in owned}) >= 3           # Ray and the actors do listen
    bad = {(owned[i], table[i]) for i in owned if table[i] not in LOOPBACK}
    assert not bad, f"listeners beyond loopback (pid, address): {sorted(bad)}"
