"""Data modules: online rollouts each epoch, expert demonstrations."""

from lit_agents.data.rollouts import (
    AgentDataModule,
    DemonstrationDataModule,
    RolloutDataModule,
)

__all__ = ["AgentDataModule", "DemonstrationDataModule", "RolloutDataModule"]
