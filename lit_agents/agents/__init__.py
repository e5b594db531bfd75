"""Agent loops: how a policy plays an environment (turns, sessions, trees)."""

from lit_agents.agents.base import Agent, written_call
from lit_agents.agents.hierarchical import HierarchicalAgent
from lit_agents.agents.multisession import MultiSessionAgent
from lit_agents.agents.react import ReActAgent
from lit_agents.agents.recursive import RecursiveAgent

__all__ = ["Agent", "written_call", "HierarchicalAgent", "MultiSessionAgent", "ReActAgent", "RecursiveAgent"]
