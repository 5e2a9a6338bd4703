"""Resident memory of ONE device process, phase by phase: a `DeviceActor` in this process
(world of one rank, no Ray) built from a config the way the pool builds it, then: rollout
engine, a rollout, role switch to training, 2 steps of accumulate (2 micro-batches) + finish,
publish, switch back to rollout, a rollout, switch to training again. Prints VmRSS, the peak
within the phase (VmHWM, reset before each phase), anonymous and file-backed RSS, in GiB.

    python bench/device_memory.py [--config examples/real-arith.toml] [--json FILE]

The micro-batches are synthetic (a 40-token prompt, 5 response tokens, 16 samples each).
Linux only (/proc/self/status, /proc/self/clear_refs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dynaresize.config import load_config
from dynaresize.core.types import RequestSpec, TrainSample
from dynaresize.devices import actor as actor_mod
from dynaresize.devices.cluster import NodeInfo
from dynaresize.devices.settings import DeviceSettings, TokenIds

GIB_KB = 2**20
PROMPT = tuple(range(100, 140))


def memory_gib() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, value = line.split(":", 1)
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / GIB_KB
    return out


def micro_batch(k: int) -> list[TrainSample]:
    return [TrainSample(0, k * 2 + i // 8, i % 8, list(PROMPT), [5, 6, 7, 8, 2], [-1.0] * 5,
                        0.5 - (i % 2), 1.0) for i in range(16)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/real-arith.toml")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    # one process, no Ray: the node is this process, collectives over a 1-rank gloo world
    actor_mod.this_node = lambda: NodeInfo("local", "127.0.0.1", os.getpid(), os.getppid())
    actor_mod.network_env = lambda ip: {}
    cfg = load_config(args.config)
    settings = DeviceSettings.build(cfg, TokenIds(49152, 2, 1, 2))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rows: list[dict[str, Any]] = []

    def phase(name: str, fn: Callable[[], Any]) -> Any:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM
        t0 = time.perf_counter()
        out = fn()
        mem = memory_gib()
        rows.append({"phase": name, **mem, "s": time.perf_counter() - t0})
        print(f"{name:36s} rss {mem['VmRSS']:.2f} peak {mem['VmHWM']:.2f} anon "
              f"{mem['RssAnon']:.2f} file {mem['RssFile']:.2f} GiB", flush=True)
        return out

    a = actor_mod.DeviceActor(0, 1, None, "cpu", 1)

    def rollout(version: int) -> list[Any]:
        a.submit([RequestSpec(0, p, s, version, PROMPT, 5, seed=p * 8 + s)
                  for p in range(4) for s in range(8)])
        return a.run_rollout(1e9, until_empty=True)

    def accumulate(step: int) -> None:
        for k in range(2):
            a.train_accumulate(step, [(k, micro_batch(k))])

    phase("start", lambda: None)
    phase("engine built (template + engine)", lambda: a.configure(settings, "rollout"))
    phase("rollout, 32 requests", lambda: rollout(0))
    phase("engine released", a.release_rollout_weights)
    phase("trainer built", lambda: a.join_train_group((0,), 1))
    for step in range(2):
        phase(f"step {step}: accumulate 2 micro-batches", functools.partial(accumulate, step))
        phase(f"step {step}: finish (combine, AdamW)",
              functools.partial(a.train_finish, step, 2, 160))
    checksum = a.param_checksum()[1]
    held = [phase("publish_weights", lambda: a.publish_weights(2)[1])]  # the driver's copy
    phase("train -> rollout: commit (leave)", lambda: a.commit_train_group(()))
    phase("train -> rollout: drop_trainer", a.drop_trainer)
    phase("engine built, weights loaded", lambda: (a.alloc_kv(), a.load_weights(2, held[0])))
    held.clear()
    phase("rollout at version 2", lambda: rollout(2))
    phase("rollout -> train", lambda: (a.release_rollout_weights(),
                                       a.join_train_group((0,), 2)))
    print("param_sha256 after 2 steps:", checksum)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"phases": rows, "param_sha256": checksum}, f, indent=1)


if __name__ == "__main__":
    main()
