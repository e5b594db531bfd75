"""LightningModules: each composes a policy with the maths in `lit_agents.algorithms`."""

from lit_agents.modules.actor_critic import System2ActorCritic, System2GRPO
from lit_agents.modules.base import AgentModule
from lit_agents.modules.grpo import GRPOPolicy
from lit_agents.modules.mosaic import MosaicPolicy
from lit_agents.modules.rao import RAOPolicy
from lit_agents.modules.sft import System1SFT

__all__ = ["AgentModule", "GRPOPolicy", "MosaicPolicy", "RAOPolicy", "System1SFT", "System2ActorCritic", "System2GRPO"]
