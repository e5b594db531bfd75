"""Helpers shared by the tool-style environments (SearchQA, Aggregation): parsing ``verb argument``
actions, error results, and a Python-function interface that counts calls as steps."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from lit_agents.envs.base import StepResult

MAX_ACTION_CHARS = 500
_ACTION = re.compile(r"(\w+)(?:\s*\[(.*)\]|\s+(.*)|)", re.S)


def verb_and_argument(text: str) -> tuple[str, str]:
    """``verb argument`` or ``verb[argument]`` -> (lowercase verb, argument), else ("", "")."""
    m = _ACTION.fullmatch(text) if len(text) <= MAX_ACTION_CHARS else None
    return (m[1].lower(), (m[2] if m[2] is not None else m[3] or "").strip()) if m else ("", "")


def error_result(message: str) -> StepResult:
    """A failed action: the message is the observation and ``info["error"]``."""
    return StepResult(observation=message, info={"error": message})


def clip(text: str, n: int = 80) -> str:
    """``text`` cut to ``n`` characters (for echoing bad input back)."""
    return text if len(text) <= n else text[:n] + "..."


def counted(state: Any, *fns: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    """Name -> function, each call counted in ``state.steps``; ValueError once ``state.done``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if state.done:
                raise ValueError("The episode is over.")
            state.steps += 1
            return fn(*args, **kwargs)

        return call

    return {fn.__name__: wrap(fn) for fn in fns}
