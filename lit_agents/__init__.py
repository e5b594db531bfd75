"""lit_agents: a PyTorch Lightning trainer for LLM agents over many turns, sessions and agents."""

from lit_agents.policy import AgentPolicy
from lit_agents.tiny import TinyConfig
from lit_agents.types import Call, Rollout, Session

__all__ = ["AgentPolicy", "Call", "Rollout", "Session", "TinyConfig"]
__version__ = "0.1.0"
