"""Callbacks shipped as ``lit_agents.callbacks``: KL anchoring, session metrics, adapter checkpoints,
sample rollouts and session graphs in TensorBoard, one line per epoch."""

from lit_agents.callbacks.checkpoint import LoRACheckpoint
from lit_agents.callbacks.epoch_lines import EpochLines
from lit_agents.callbacks.kl_anchor import KLAnchor
from lit_agents.callbacks.rollout_samples import RolloutSamples
from lit_agents.callbacks.session_metrics import SessionMetrics, session_stats

__all__ = ["EpochLines", "KLAnchor", "LoRACheckpoint", "RolloutSamples", "SessionMetrics", "session_stats"]
