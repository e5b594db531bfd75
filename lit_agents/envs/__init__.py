"""Environments: the `TextEnv` protocol and the environments built on it."""

from lit_agents.envs.base import StepResult, Task, TextEnv, play_expert
from lit_agents.envs.textcraft import TextCraft
from lit_agents.envs.textcraft_synth import TextCraftSynth

__all__ = ["StepResult", "Task", "TextCraft", "TextCraftSynth", "TextEnv", "play_expert"]
