"""A rollout device's vLLM engine, built from the run's settings (`devices.builders`): the
version-0 model written to /dev/shm for vLLM to load (`rollout.vllm_world.model_dir`), and
removed once the engine loaded it or its start failed. A device process ends by SIGKILL (no
atexit), so files left there would stay until the machine reboots. vLLM itself is imported by
`rollout.vllm_engine` only, when the engine starts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dynaresize.config import RolloutConfig
from dynaresize.rollout.speculative import settings_from_config
from dynaresize.rollout.vllm_world import drop_model_dir, model_dir

if TYPE_CHECKING:
    from dynaresize.rollout.vllm_engine import VllmRolloutEngine

MAX_MODEL_LEN = 4096
"""Most positions a vLLM engine serves (fewer if the model has fewer)."""


def build_vllm_engine(rollout: RolloutConfig, template: Any, *, eos_token_id: int,
                      device_index: int, torch_device: str) -> VllmRolloutEngine:
    """The engine of a rollout device: `template` (the version-0 transformers model) written
    to /dev/shm for vLLM to load, served with the run's settings; the files go once loaded,
    and also if the start fails (whatever raised is raised)."""
    from dynaresize.rollout.vllm_engine import VllmRolloutEngine

    positions = int(getattr(template.config, "max_position_embeddings", MAX_MODEL_LEN))
    try:
        return VllmRolloutEngine(model_dir(template), eos_token_id=eos_token_id,
                                 device_index=device_index,
                                 max_running=rollout.max_running_requests,
                                 max_model_len=min(positions, MAX_MODEL_LEN),
                                 kv_cache_bytes=rollout.vllm_kv_cache_bytes,
                                 torch_device=torch_device,
                                 speculation=settings_from_config(rollout.speculative))
    finally:
        drop_model_dir(template)
