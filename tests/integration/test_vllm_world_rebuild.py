"""vLLM after a world rebuild, live: a real `DeviceActor` (in a fresh Python process, no Ray)
builds a vLLM engine, re-forms its world as a recovery does (`rebuild_world`: the device's
`destroy_process_group()`), and builds the next engine, twice. Before
`rollout.vllm_world.vllm_groups_kept_apart`, the second engine failed with "Process group ...
is not initialized in the world group map". Skipped without vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm")

SCRIPT = textwrap.dedent('''
    import os
    from dynaresize.devices import actor as actor_mod
    from dynaresize.devices.cluster import NodeInfo
    actor_mod.this_node = lambda: NodeInfo("local", "127.0.0.1", os.getpid(), os.getppid())
    from dynaresize.config import load_config
    from dynaresize.devices.settings import DeviceSettings
    from dynaresize.devices.world import open_store
    from dynaresize.tasks import make_task
    cfg = load_config(None, ["rollout.engine='vllm'", "model.num_heads=2",
                             "rollout.vllm_kv_cache_bytes=33554432"], check_machine=False)
    settings = DeviceSettings.build(cfg, make_task(cfg).tokenizer)
    device = actor_mod.DeviceActor(0, 1, open_store("127.0.0.1"), "cpu", 1, 30.0)
    device.configure(settings, "rollout")
    for k in range(2):
        device.rebuild_world(open_store("127.0.0.1"), {0: 0}, (), 0, False)
        device.release_rollout_weights()
        device.alloc_kv()
        print("ENGINE AFTER REBUILD", k, flush=True)
    os._exit(0)
''')


def test_a_vllm_engine_builds_after_the_world_was_rebuilt() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert "not initialized in the world group map" not in proc.stderr
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("ENGINE AFTER REBUILD") == 2
