"""Callbacks shipped as ``lit_agents.callbacks``: KL anchoring, session metrics, adapter checkpoints,
sample rollouts and session graphs in TensorBoard."""

from lit_agents.callbacks.checkpoint import LoRACheckpoint
from lit_agents.callbacks.kl_anchor import KLAnchor
from lit_agents.callbacks.rollout_samples import RolloutSamples
from lit_agents.callbacks.session_metrics import SessionMetrics, session_stats

__all__ = ["KLAnchor", "LoRACheckpoint", "RolloutSamples", "SessionMetrics", "session_stats"]
