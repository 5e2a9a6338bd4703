"""Spawned gloo jobs for the distributed tests (shared by the integration tests): a file
rendezvous, the per-rank set-up, and a bounded wait that ends every process it started."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def file_store(directory: Path, name: str) -> str:
    """A `file://` rendezvous: unlike a TCPStore (whose server binds every interface), it
    opens no socket at all."""
    return f"file://{directory / f'store-{name}'}"


def init_gloo(rank: int, world_size: int, store: str) -> None:
    """In a spawned rank: loopback only, one thread (exact results need equal thread counts),
    then the default process group over `store`."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))


def end_rank() -> None:
    """In a spawned rank whose results are on disk: wait for the other ranks, then end the
    process at once (`os._exit(0)`) instead of tearing gloo down: a rank destroying its
    process group while its peer did the same aborted now and then under load (SIGABRT,
    "terminate called without an active exception", in gloo's teardown), failing a test
    whose results were already written."""
    dist.barrier()
    os._exit(0)


def run_jobs(jobs: list[tuple[Callable[..., None], int, tuple[Any, ...]]], timeout_s: float,
             what: str) -> float:
    """Start each (worker, nprocs, args) job (spawned, `worker(rank, *args)`), wait for all
    with one deadline, terminate whatever is left; returns the seconds taken."""
    t0 = time.monotonic()
    started = [mp.start_processes(fn, args=args, nprocs=n, join=False, start_method="spawn")
               for fn, n, args in jobs]
    try:
        for job in started:
            while not job.join(timeout=1.0):
                if time.monotonic() - t0 > timeout_s:
                    pytest.fail(f"{what} timed out after {timeout_s:.0f} s")
    finally:
        for job in started:
            for proc in job.processes:
                if proc.is_alive():
                    proc.terminate()
                proc.join(5)
    return time.monotonic() - t0
