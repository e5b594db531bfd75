"""The one data model: a rollout is a graph of sessions, a session a list of LLM calls; and what
environments hand out and return (`Task`, `StepResult`) and a played text episode (`Episode`).
The bottom layer: it imports nothing of the package.

Every method in the library is a view of this structure (docs/architecture.md, Data model): advantage functions
read rewards off rollouts and sessions; `algorithms/collate.py` turns each append-only session
into one training row, training on exactly the token ids that were sampled.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SessionKind = Literal["main", "compaction", "subagent"]

#: ``train``; ``val``: held-out instances of train tasks; ``test``: held-out tasks (e.g. unseen goals)
Split = Literal["train", "val", "test"]


@dataclass(frozen=True)
class Task:
    """One task: what the agent must achieve. ``task_id`` is unique within an env and split."""

    task_id: str
    goal: str
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass
class StepResult:
    """What one action did.

    Attributes:
        observation: text shown to the agent next.
        reward: reward for this step (TextCraft: 1.0 on the step that crafts the goal).
        done: the episode is over (solved, or the env ended it).
        success: the task is solved.
        info: extra data (``error`` for a malformed or failed action, ...).
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    success: bool = False
    info: dict[str, Any] = field(default_factory=dict)


def _expect(d: Any, key: str, kind: type, where: str = "") -> None:
    """Raise a ValueError naming ``key`` unless ``d[key]`` is a ``kind``."""
    if not isinstance(d, dict) or key not in d:
        raise ValueError(f"{where}no {key!r}")
    if not isinstance(d[key], kind):
        raise ValueError(f"{where}{key!r} must be a {kind.__name__}, got {json.dumps(d[key])[:60]}")


@dataclass
class Episode:
    """One played episode in text: the first observation, then (action, result) per step.

    ``subgoals`` (hierarchical agents only): per step ``{"subgoal", "start", "flag"}``: the
    subgoal the action served, whether it opened that subgoal, and the executor's done flag.
    """

    task: Task
    observation: str
    steps: list[tuple[str, StepResult]] = field(default_factory=list)
    success: bool = False
    env: str = ""
    subgoals: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": asdict(self.task),
            "observation": self.observation,
            "steps": [
                {"action": a, "observation": r.observation, "reward": r.reward, "done": r.done, "success": r.success,
                 **(self.subgoals[i] if self.subgoals else {})}
                for i, (a, r) in enumerate(self.steps)
            ],
            "success": self.success,
            "env": self.env,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        try:
            _expect(d, "observation", str)
            _expect(d, "steps", list)
            for i, step in enumerate(d["steps"]):
                for key, kind in (("action", str), ("observation", str)):
                    _expect(step, key, kind, f"step {i}: ")
            steps = [
                (s["action"], StepResult(s["observation"], float(s.get("reward", 0.0)), bool(s.get("done", False)),
                                         bool(s.get("success", False))))
                for s in d["steps"]
            ]
            notes = [{k: s[k] for k in ("subgoal", "start", "flag") if k in s} for s in d["steps"]]
            subgoals = notes if notes and all(notes) else None
            return cls(Task(**d["task"]), d["observation"], steps, bool(d.get("success", False)), d.get("env", ""),
                       subgoals)
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a demonstration episode (see lit_agents.data.demos): {err!r}") from err


@dataclass
class Call:
    """One LLM call, token-in/token-out.

    Attributes:
        prompt_ids: the tokens appended to the session's context before this call (for the first
            call of a session the whole prompt; afterwards the environment observation plus chat
            markup). Never trained on.
        completion_ids: the sampled tokens, stop token included when one was sampled.
        logprobs: the sampler's log-probability of each completion token (same length).
        role: the adapter (role) that produced the completion.
        policy_version: the optimizer step of the policy that sampled it.
        prompt_text: the text behind ``prompt_ids`` (for logs and viewers only).
        completion_text: the decoded completion (for logs and viewers only).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    role: str = "default"
    policy_version: int = 0
    prompt_text: str = ""
    completion_text: str = ""

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError(
                f"Call has {len(self.completion_ids)} completion ids but {len(self.logprobs)} logprobs"
            )


@dataclass
class Session:
    """One context window: the calls made in it, in order, each extending the same context.

    Attributes:
        session_id: index of this session inside its rollout.
        kind: ``main``, ``compaction`` (started from a summary) or ``subagent`` (forked by a parent).
        parent: ``session_id`` of the parent session, ``None`` for the root.
        depth: 0 for the root, parent's depth + 1 below it.
        calls: the LLM calls of the session, in order.
        reward: the session's own reward where the environment scores it (e.g. a subagent's success).
        goal: the session's own goal where it has one (a subagent's, a tree node's, a Multi2
            executor's subgoal); ``""`` for a session working on the task itself.
        success: whether the session met its own goal; None where it has none.
        progress_before, progress_after: the task's progress (``env.progress``, 0-1) when the
            session opened and closed; None where the loop does not record it.
        goal_progress_before, goal_progress_after: the same for the session's own goal
            (``env.goal_progress``); None without a goal.
        advantage: the advantage the session's generated tokens were trained with in the epoch
            that played it (the mean where each call had its own); None if it was not trained
            (validation, no generated token, a group without signal). Set from the rows by
            `collate.record_advantages`, so saved rollouts and the viewer show it.
        meta: what a single method reads besides (per-turn progress and errors, Multi2's per-step
            rewards, ...).
    """

    session_id: int = 0
    kind: SessionKind = "main"
    parent: int | None = None
    depth: int = 0
    calls: list[Call] = field(default_factory=list)
    reward: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    goal: str = ""
    success: bool | None = None
    progress_before: float | None = None
    progress_after: float | None = None
    goal_progress_before: float | None = None
    goal_progress_after: float | None = None
    advantage: float | None = None

    @property
    def token_ids(self) -> list[int]:
        """The whole context: prompt and completion ids of every call, concatenated."""
        ids: list[int] = []
        for call in self.calls:
            ids += call.prompt_ids + call.completion_ids
        return ids

    @property
    def action_mask(self) -> list[bool]:
        """True on generated tokens (trained on), False on prompts and observations."""
        mask: list[bool] = []
        for call in self.calls:
            mask += [False] * len(call.prompt_ids) + [True] * len(call.completion_ids)
        return mask

    @property
    def sampler_logprobs(self) -> list[float]:
        """Sampler log-probs aligned with ``token_ids`` (0.0 on non-generated tokens)."""
        out: list[float] = []
        for call in self.calls:
            out += [0.0] * len(call.prompt_ids) + list(call.logprobs)
        return out

    @property
    def num_generated(self) -> int:
        return sum(len(c.completion_ids) for c in self.calls)

    @property
    def num_tokens(self) -> int:
        return sum(len(c.prompt_ids) + len(c.completion_ids) for c in self.calls)


@dataclass
class Rollout:
    """One attempt at one task: a graph of sessions plus the task outcome.

    Attributes:
        task_id: the task attempted.
        group_id: rollouts of the same task in the same batch share it (advantages are per group).
        sessions: the sessions; ``sessions[0]`` is the root.
        reward: the task outcome reward.
        success: whether the task was solved.
        meta: free-form data (steps taken, errors, termination reason, ...).
    """

    task_id: str
    group_id: int
    sessions: list[Session] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_turns(self) -> int:
        return sum(len(s.calls) for s in self.sessions)

    @property
    def num_generated(self) -> int:
        return sum(s.num_generated for s in self.sessions)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.sessions)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``Rollout.from_dict`` inverts it)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rollout:
        """Also reads rollouts saved before a session's goal, success, progress and advantage were
        fields (then in ``meta``; Multi2's executor success as ``meta["met"]``, its goal as ``"subgoal"``)."""
        sessions = [Session(**_typed({**s, "calls": [Call(**c) for c in s["calls"]]})) for s in data["sessions"]]
        return cls(**{**data, "sessions": sessions})


#: the `Session` fields that say how a session did (what older saved files kept in ``meta``)
SESSION_OUTCOME_FIELDS = ("goal", "success", "progress_before", "progress_after", "goal_progress_before",
                          "goal_progress_after")


def _typed(session: dict[str, Any]) -> dict[str, Any]:
    """A saved session's dict with the typed fields taken from ``meta`` where an older file kept them."""
    meta = dict(session.get("meta") or {})
    if "met" in meta and "success" not in meta:
        meta["success"] = meta.pop("met")
    if "subgoal" in meta and "goal" not in meta:
        meta["goal"] = meta.pop("subgoal")
    for key in (*SESSION_OUTCOME_FIELDS, "advantage"):
        if key not in session and key in meta:
            session[key] = meta.pop(key)
    return {**session, "meta": meta}
