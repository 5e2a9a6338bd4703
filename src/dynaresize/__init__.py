"""dynaresize: RL post-training with Rollout and Training GPU pools resized at runtime."""

__version__ = "0.1.0"
