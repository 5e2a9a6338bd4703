"""What a device process builds from its run's settings: the version-0 model, a rollout engine
and a trainer (`devices.actor.DeviceActor` holds one `DeviceBuilder`).

The model is built once per model config and kept as a CPU template; later builds copy the
template into a model constructed without initialisation (~0.1 s, where a random init of 100M
parameters takes 1.5-7 s on one thread): the new trainers of a reshard and the engine of a
device that starts serving are built on a resize's critical path.
"""

from __future__ import annotations

from typing import Any

from dynaresize.devices.memory import clone_model
from dynaresize.devices.settings import DeviceSettings
from dynaresize.rollout.engine_base import Engine

__all__ = ["DeviceBuilder"]


class DeviceBuilder:
    """Builds a device's model, engine and trainers; keeps the model template."""

    def __init__(self, index: int, torch_device: str) -> None:
        self.index = index
        self.torch_device = torch_device
        self._template: Any = None
        self._template_key: tuple[Any, ...] | None = None

    def template(self, settings: DeviceSettings) -> Any:
        """The version-0 model (the same on every device), kept on the CPU: built once per
        model config."""
        from dynaresize.models import build_model

        tok = settings.tokens
        key = (repr(settings.model), tok.vocab_size, tok.eos_id, tok.bos_id, tok.pad_id)
        if self._template_key != key:
            self._template = build_model(settings.model, tok.vocab_size, eos_token_id=tok.eos_id,
                                         bos_token_id=tok.bos_id, pad_token_id=tok.pad_id)
            self._template_key = key
        return self._template

    def model(self, settings: DeviceSettings, blank: bool = False) -> Any:
        """A copy of the version-0 model on this device. `blank`: parameters left
        uninitialised, for a model whose every parameter is overwritten next. A template
        memory-mapped from its safetensors file leaves this process's resident memory after
        each copy (`devices.file_pages`: its pages stay in the page cache, unchanged)."""
        from dynaresize.devices.file_pages import drop_model_file_pages

        template = self.template(settings)
        model = clone_model(template, blank).to(self.torch_device)
        drop_model_file_pages(template)
        return model

    def engine(self, settings: DeviceSettings, blank: bool = False) -> Engine:
        """The rollout engine `settings.rollout` names (`blank`: its weights are loaded
        next)."""
        from dynaresize.rollout.engine import RolloutEngine
        from dynaresize.rollout.speculative import settings_from_config

        rollout = settings.rollout
        if rollout.engine == "vllm":  # vLLM in this process (docs/vllm.md)
            from dynaresize.rollout.vllm_build import build_vllm_engine

            # vLLM loads the template from disk: no copy of it on this device
            return build_vllm_engine(rollout, self.template(settings),
                                     eos_token_id=settings.tokens.eos_id,
                                     device_index=self.index, torch_device=self.torch_device)
        return RolloutEngine(self.model(settings, blank),
                             eos_token_id=settings.tokens.eos_id,
                             device_index=self.index,
                             max_running=rollout.max_running_requests,
                             batch_invariant=rollout.batch_invariant,
                             torch_device=self.torch_device,
                             whole_prompt_prefill=rollout.whole_prompt_prefill,
                             forward_rows=rollout.speculative.forward_rows,
                             speculation=settings_from_config(rollout.speculative))

    def trainer(self, settings: DeviceSettings, group: Any, generation: int,
                blank: bool = False) -> Any:
        """An `FSDPTrainer` over the process group `group`. `blank`: the caller overwrites
        every parameter (a reshard), so the model need not hold version 0, unless a KL
        reference (the version-0 policy) is built from it."""
        from dynaresize.train.trainer import FSDPTrainer

        blank = blank and settings.train.kl_coef == 0

        def factory() -> Any:
            return self.model(settings, blank)

        return FSDPTrainer(factory, settings.train, group, generation=generation,
                           device=self.torch_device, temperature=settings.rollout.temperature,
                           pad_token_id=settings.tokens.pad_id,
                           max_new_tokens=settings.max_new_tokens)
