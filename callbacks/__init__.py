"""Callbacks shipped as ``lit_agents.callbacks``: KL anchoring, session metrics, adapter checkpoints."""

from lit_agents.callbacks.checkpoint import LoRACheckpoint
from lit_agents.callbacks.kl_anchor import KLAnchor
from lit_agents.callbacks.session_metrics import SessionMetrics, session_stats

__all__ = ["KLAnchor", "LoRACheckpoint", "SessionMetrics", "session_stats"]
