"""Environments: the `TextEnv` protocol and the environments built on it.

Built in: `TextCraft`, `TextCraftSynth`, `SearchQA` (multi-hop search, the BrowseComp /
DeepDive stand-in), `Aggregation` (long-log aggregation, the Oolong stand-in),
`TextWorldExpress` (Java). Optional extras:
`ScienceWorld` (``lit-agents[scienceworld]``, Java), `ALFWorld` (``lit-agents[alfworld]``).
The published worlds load lazily, so importing this package needs neither Java nor the extras.
"""

from lit_agents.envs.aggregation import Aggregation
from lit_agents.envs.base import StepResult, Task, TextEnv, play_expert
from lit_agents.envs.search_qa import SearchQA
from lit_agents.envs.textcraft import TextCraft
from lit_agents.envs.textcraft_synth import TextCraftSynth

_LAZY = {
    "TextWorldExpress": "lit_agents.envs.textworld_express",
    "ScienceWorld": "lit_agents.envs.scienceworld",
    "ALFWorld": "lit_agents.envs.alfworld",
}

__all__ = [
    "Aggregation",
    "SearchQA",
    "StepResult",
    "Task",
    "TextCraft",
    "TextCraftSynth",
    "TextEnv",
    "play_expert",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_agents.envs' has no attribute {name!r}")
