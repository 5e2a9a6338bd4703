"""The RL-recipe sections of the config (`[train.loss]`, `[train.dynamic_sampling]`;
docs/recipes.md), nested in `schema.TrainConfig`. No torch/Ray."""

from __future__ import annotations

from dataclasses import dataclass

from dynaresize.config.fields import doc_field as _doc

AGGREGATIONS = ("token", "sequence", "group", "constant")
ADVANTAGES = ("grpo", "dr-grpo")
RATIOS = ("token", "sequence")
KL_ESTIMATORS = ("k1", "k2", "k3")




@dataclass
class LossConfig:
    """`[train.loss]`: the policy loss and advantage options of the RL recipes (GRPO, DAPO,
    Dr. GRPO, GSPO; docs/recipes.md). The defaults are the original loss."""

    clip_low: float = _doc("Lower PPO clip range: the ratio is clipped at 1 - clip_low "
                           "(0: train.clip_eps).", default=0.0)
    clip_high: float = _doc("Upper PPO clip range: the ratio is clipped at 1 + clip_high "
                            "(0: train.clip_eps; DAPO's clip-higher: 0.28).", default=0.0)
    aggregation: str = _doc("How token losses sum into the step's loss: 'token' (sum / all "
                            "response tokens of the step: DAPO), 'sequence' (mean over "
                            "sequences of each one's token mean: GRPO), 'group' (mean over "
                            "groups of each group's token mean) or 'constant' (sum / "
                            "(sequences x task.max_new_tokens): Dr. GRPO).", default="token")
    advantage: str = _doc("Advantage: 'grpo' ((r - group mean) / (group std + 1e-6)) or "
                          "'dr-grpo' (r - group mean, no std).", default="grpo")
    ratio: str = _doc("Importance ratio: 'token' (PPO/GRPO, per token) or 'sequence' (GSPO: "
                      "exp of the sequence's mean token log-ratio, one per sequence).",
                      default="token")
    kl_estimator: str = _doc("KL-to-reference estimator when train.kl_coef > 0: 'k1' (logp - "
                             "ref), 'k2' ((logp - ref)^2 / 2) or 'k3' (exp(ref - logp) - "
                             "(ref - logp) - 1).", default="k3")
    entropy_coef: float = _doc("Entropy bonus: the loss subtracts this x the policy's token "
                               "entropy (aggregated like the loss); 0: off.", default=0.0)
    overlong_window: int = _doc("DAPO overlong shaping: responses longer than "
                                "task.max_new_tokens - this many tokens get a penalty growing "
                                "linearly to overlong_penalty at task.max_new_tokens, added "
                                "to the reward for the advantage only (records keep the task "
                                "reward); 0: off.", default=0)
    overlong_penalty: float = _doc("DAPO overlong shaping: the penalty at the cap.", default=1.0)


@dataclass
class DynamicSamplingConfig:
    """`[train.dynamic_sampling]`: DAPO's dynamic sampling (docs/recipes.md)."""

    enabled: bool = _doc("Train each step on task.prompts_per_step (B) groups whose rewards "
                         "are not all equal, from a seeded stream of max_rounds x B prompts: "
                         "some are dispatched up front, then one more each time a group "
                         "without a signal finishes. The batch is the first prompts of the "
                         "stream up to the B-th with a signal (a function of the seed and "
                         "the rewards, never of timing); its other groups are recorded as "
                         "dropped (kept = false). Streaming training needs "
                         "train.max_tokens_per_micro_batch > 0 with it (a group trains once it "
                         "is known to be kept).", default=False)
    max_rounds: int = _doc("Cap: the step's stream holds max_rounds x task.prompts_per_step "
                           "prompts.", default=3)
    margin: float = _doc("Prompts dispatched up front: B x (1 + margin x f) / (1 - f), f the "
                         "filter rate of the newest step that ended before this one started "
                         "(B before there is one), within [B, the stream]; the top-up "
                         "dispatches the rest as groups finish (a shortfall costs one more "
                         "group's latency: docs/results.md#twin-dynamic).", default=1.0)
