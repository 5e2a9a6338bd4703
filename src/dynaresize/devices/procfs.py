"""What /proc tells about a process on this machine (Linux; no torch, no Ray): whether it
runs, when it started (so a reused pid is not mistaken for it) and how much CPU it used."""

from __future__ import annotations


def proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int:
    """When process `pid` started (clock ticks after boot; stat field 22), -1 if gone."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else -1


def cpu_ticks(pid: int) -> int:
    """CPU time process `pid` used so far, all threads (utime + stime, clock ticks)."""
    fields = proc_stat(pid)
    return int(fields[11]) + int(fields[12]) if fields is not None and len(fields) > 12 else -1


def process_alive(pid: int, started: int | None = None) -> bool:
    """Whether `pid` runs and is not a zombie; `started`: and is the process that started
    then (not another one the pid was given to since)."""
    fields = proc_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return started is None or (len(fields) > 19 and int(fields[19]) == started)
