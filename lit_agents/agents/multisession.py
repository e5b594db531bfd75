"""Mosaic's multi-session loop: context compaction and subagent forking over a text env.

A rollout is several sessions (docs/algorithms.md, Mosaic):

- **compaction** (``compaction=True``): when a session's context would pass ``context_budget``
  tokens, or the policy writes the ``compact`` action, the policy is asked for a summary (the
  request is an observation; the summary is generated, and trained, in the ending session); a
  new ``compaction`` session starts whose prompt is the task + the summary, not the old history.
- **forking** (``forking=True``): the action ``fork: <goal>`` starts a ``subagent`` session of the
  same policy with a fresh context on ``goal`` (a goal ``env.goal_met`` can check, e.g. TextCraft's
  ``craft 4 oak planks``), acting on the same environment state. It ends when its goal is met,
  when it writes ``done``, or after ``subagent_steps``; its result returns to the parent as an
  observation (masked in the parent's loss, like every observation).

Every session records ``progress_before``/``progress_after`` (``env.progress``) for Mosaic's
marginal gains, per call ``meta["errors"]`` and ``meta["progress"]`` (as `ReActAgent`) and, for
subagents, its ``goal``, ``success`` and
``goal_progress_before``/``goal_progress_after`` (``env.goal_progress`` of its own goal): typed
fields of `Session`. Limits: forks and sessions per rollout. All live sessions of all episodes are batched per step.

Extension points for subclasses (docs/extending.md, examples/subclasses.py): `should_compact`
(when to compact), `compaction_prompt` and `subagent_prompt` (how a session opens),
`expert_text` (when the expert opens sessions), and `parse_action` and `system_text` from
`ReActAgent`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lit_agents.agents.base import Cursor, env_error_session, reset_env, sample_turns, step_env, write_turn
from lit_agents.agents.react import ReActAgent
from lit_agents.envs.base import TextEnv, expert_episodes
from lit_agents.policy import AgentPolicy
from lit_agents.types import Episode, Rollout, Session, Task

SUMMARY_REQUEST = "Context full. Summarize your progress and what is left, in a few lines."
COMPACT, DONE, FORK = "compact", "done", "fork:"


@dataclass(kw_only=True)
class _Line(Cursor):
    """One live session: the episode's main line (main/compaction) or a subagent."""

    episode: _Ep
    goal: str = ""
    parent: _Line | None = None
    steps: int = 0
    summarizing: bool = False
    waiting: bool = False
    done: bool = False
    last_observation: str = ""


@dataclass
class _Ep:
    """One episode, with everything of its run: the system message, and the env whose experts
    write the turns when the run is an expert demonstration (None: the policy writes them)."""

    task: Task
    group_id: int
    state: Any
    task_text: str
    system: str = ""
    expert: TextEnv | None = None
    sessions: list[Session] = field(default_factory=list)
    steps: int = 0
    forks: int = 0
    compactions: int = 0
    reward: float = 0.0
    success: bool = False
    done: bool = False
    reason: str = ""


class MultiSessionAgent(ReActAgent):
    """ReAct with context compaction and subagent forking (each a switch).

    Args:
        compaction: allow compaction (budget-triggered and the ``compact`` action).
        context_budget: tokens a session may hold before it must compact.
        summary_tokens: longest summary.
        forking: allow ``fork: <goal>``.
        (``max_steps`` counts every action turn of every session: env actions, forks, ``compact``.)
        max_forks: forks per rollout.
        max_sessions: sessions per rollout (further compactions end the episode, forks are refused).
        subagent_steps: actions per subagent.
        **kwargs: see `ReActAgent` (max_new_tokens, temperature, max_steps (all sessions), ...).
    """

    def __init__(
        self,
        compaction: bool = True,
        context_budget: int = 512,
        summary_tokens: int = 64,
        forking: bool = False,
        max_forks: int = 4,
        max_sessions: int = 8,
        subagent_steps: int = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.compaction, self.context_budget, self.summary_tokens = compaction, context_budget, summary_tokens
        self.forking, self.max_forks, self.max_sessions = forking, max_forks, max_sessions
        self.subagent_steps = subagent_steps

    # ------------------------------------------------------------------ extension points
    def should_compact(self, tokens: int) -> bool:
        """Whether the main line asks for a summary now (with ``compaction`` on; the ``compact``
        action asks too). Default: when the next turn (``max_new_tokens``) would take the
        session past ``context_budget``. Override for another trigger (a share of the budget,
        a number of turns).

        Args:
            tokens: the session's tokens so far, the prompt of its next turn (the latest
                observation) included.
        """
        return tokens + self.max_new_tokens > self.context_budget

    def compaction_prompt(self, task_text: str, summary: str) -> str:
        """The first prompt of a ``compaction`` session: the task, then the summary."""
        return f"{task_text}\n\nSummary of earlier work:\n{summary}"

    def subagent_prompt(self, task_text: str, goal: str, observation: str) -> str:
        """The first prompt of a ``subagent`` session: the task, its goal, the parent's latest
        observation."""
        return f"{task_text}\n\nYou are a subagent. Your goal: {goal}\n{observation}".rstrip()

    # ------------------------------------------------------------------ rollouts
    def run(self, policy: AgentPolicy, env: TextEnv, tasks: list[Task], group_size: int = 1, *,
            greedy: bool = False, seed: int = 0, group_offset: int = 0, policy_version: int = 0) -> list[Rollout]:
        return self._play(policy, env, tasks, group_size, greedy=greedy, seed=seed, group_offset=group_offset,
                          policy_version=policy_version)

    def _play(self, policy: AgentPolicy, env: TextEnv, tasks: list[Task], group_size: int = 1, *,
              greedy: bool = False, seed: int = 0, group_offset: int = 0, policy_version: int = 0,
              expert: bool = False) -> list[Rollout]:
        """`run`; with ``expert`` the env's experts write every turn (`expert_rollout`)."""
        episodes, lines = [], []
        system = self.system_text(env)
        for i, task in enumerate(tasks):
            for _ in range(group_size):
                reset = reset_env(env, task)
                if isinstance(reset, Exception):
                    session = env_error_session(reset)
                    session.progress_before = session.progress_after = 0.0
                    episodes.append(_Ep(task, group_offset + i, None, "", done=True, reason="env_error",
                                        sessions=[session]))
                    continue
                state, first = reset
                ep = _Ep(task, group_offset + i, state, first, system, env if expert else None)
                episodes.append(ep)
                lines.append(self._open(policy, env, ep, "main", first))
        act = self.sampling(policy, self.max_new_tokens, greedy=greedy)
        summarize = self.sampling(policy, self.summary_tokens, greedy=greedy)
        engine, generator = self.engine(policy, seed)
        while True:
            ready = [ln for ln in lines if not ln.done and not ln.waiting and not ln.episode.done]
            if not ready:
                break
            for params, group in ((act, [ln for ln in ready if not ln.summarizing]),
                                  (summarize, [ln for ln in ready if ln.summarizing])):
                if group:
                    texts = self.complete(policy, engine, group, params, generator, policy_version)
                    for line, text in zip(group, texts):
                        lines += self._advance_line(policy, env, line, text)
        return [self._rollout(env, ep) for ep in episodes]

    def complete(self, policy, engine, lines: list[_Line], params, generator, version: int) -> list[str]:
        """One batched model call; records each call in its session. In an expert run
        (`expert_rollout`) the env's experts write the texts instead."""
        expert = lines[0].episode.expert  # a run is all expert or all policy
        if expert is not None:
            return [write_turn(policy, ln, self.expert_text(expert, ln)) for ln in lines]
        return sample_turns(policy, engine, lines, params, generator, version)

    # ------------------------------------------------------------------ demonstrations
    def expert_text(self, env: TextEnv, line: _Line) -> str:
        """The expert's turn in a multi-session episode: the env's summary when asked to compact;
        in a subagent, the subgoal expert's action; in the main line, with forking on, a fork for
        every intermediate subgoal (the last, the goal itself, it crafts itself), else the
        expert's action. Override for another policy of when to open sessions."""
        ep = line.episode
        if line.summarizing:
            return env.expert_summary(ep.state)
        if line.parent is not None:
            return env.expert_subgoal_action(ep.state, line.goal)
        if self.forking and ep.forks < self.max_forks and len(ep.sessions) < self.max_sessions:
            subgoal = env.expert_subgoal(ep.state)
            if not env.goal_met(ep.state, subgoal) and not self._is_final(env, ep, subgoal):
                return f"{FORK} {subgoal}"
        return env.expert_action(ep.state)

    @staticmethod
    def _is_final(env: TextEnv, ep: _Ep, subgoal: str) -> bool:
        """Whether meeting ``subgoal`` is meeting the task (then forking it gains nothing)."""
        goal = getattr(ep.state, "goal", None)
        return goal is not None and subgoal.lower().endswith(str(goal).split(":")[-1].replace("_", " "))

    def expert_rollout(self, policy: AgentPolicy, env: TextEnv, task: Task, group_id: int = 0) -> Rollout:
        """The env's experts playing ``task`` through this loop: compaction where the policy's
        token budget forces it (the summary is ``env.expert_summary``), forks where
        `expert_text` decides; every completion tokenized as the policy would write it."""
        return self._play(policy, env, [task], 1, greedy=True, group_offset=group_id, expert=True)[0]

    def expert_episode(self, env: TextEnv, task: Task, epsilon: float = 0.0, seed: int = 0) -> Episode:
        """The env actions of the expert as a text episode (a record; `replay` plays the
        multi-session structure again with the policy's tokenizer, since where compaction falls
        depends on token counts)."""
        if epsilon:
            raise ValueError("noisy multi-session demonstrations are not supported")
        return next(iter(expert_episodes(env, [task])))

    def replay(self, policy: AgentPolicy, env: TextEnv, episode: Episode, group_id: int = 0) -> Rollout:
        """A demonstration as this loop's sessions: the experts play ``episode.task`` again
        (`expert_rollout`). Episodes of other demonstrators cannot be replayed as multi-session
        rollouts (their compaction points and summaries are unknown)."""
        return self.expert_rollout(policy, env, episode.task, group_id)

    def _open(self, policy, env, ep: _Ep, kind: str, prompt: str, parent: _Line | None = None,
              goal: str = "") -> _Line:
        session = Session(len(ep.sessions), kind, None if parent is None else parent.session.session_id,
                          0 if parent is None else parent.session.depth + 1,
                          progress_before=float(env.progress(ep.state)))
        if goal:
            session.goal, session.success = goal, False
            session.goal_progress_before = self._goal_progress(env, ep, goal)
        session.meta.update(progress=[session.progress_before], errors=[])
        ep.sessions.append(session)
        line = _Line(episode=ep, session=session, goal=goal, parent=parent)
        line.start(policy, ep.system, prompt)
        return line

    def _close(self, env, line: _Line) -> None:
        line.done = True
        line.session.progress_after = float(env.progress(line.episode.state))
        if line.goal:
            line.session.goal_progress_after = self._goal_progress(env, line.episode, line.goal)

    @staticmethod
    def _goal_progress(env, ep: _Ep, goal: str) -> float:
        try:
            return float(env.goal_progress(ep.state, goal))
        except Exception:  # an env that cannot score this goal: no subagent credit from it
            return 0.0

    def _advance_line(self, policy, env, line: _Line, text: str) -> list[_Line]:
        """Apply one completion; returns new sessions to run. Records, per call of the session,
        whether it was a failed env action (``meta["errors"]``) and the task's progress after it
        (``meta["progress"]``), as `ReActAgent` does: `GRPOPolicy`'s per-turn credit reads them."""
        meta = line.session.meta
        meta["errors"].append(False)  # set by _apply when the env says the action failed
        new = self._apply(policy, env, line, text)
        ep = line.episode
        meta["progress"].append(1.0 if ep.success else float(env.progress(ep.state)))
        return new

    def _apply(self, policy, env, line: _Line, text: str) -> list[_Line]:
        ep = line.episode
        if line.summarizing:  # the summary ends this session; a compaction session continues
            self._close(env, line)
            ep.compactions += 1
            if len(ep.sessions) >= self.max_sessions:
                ep.done, ep.reason = True, "max_sessions"
                return []
            return [self._open(policy, env, ep, "compaction", self.compaction_prompt(ep.task_text, text))]
        action = self.parse_action(text)
        ep.steps += 1  # every action turn counts, env action or not (refused forks cannot loop)
        line.steps += 1
        max_steps = self.max_steps or env.max_steps
        if ep.steps > max_steps:
            for other in [line] + ([line.parent] if line.parent else []):
                self._close(env, other)
            ep.done, ep.reason = True, "max_steps"
            return []
        if self.compaction and line.parent is None and action.lower() == COMPACT:
            line.summarizing = True
            line.follow(policy, SUMMARY_REQUEST)
            return []
        if line.parent is not None and action.lower() == DONE:
            return self._end_subagent(policy, env, line, "the subagent said it is done")
        if self.forking and line.parent is None and action.lower().startswith(FORK):
            return self._fork(policy, env, line, action[len(FORK):].strip())
        result = step_env(env, ep.state, action, ep.task)
        if isinstance(result, Exception):
            for other in [line] + ([line.parent] if line.parent else []):
                self._close(env, other)
            ep.done, ep.reason, ep.reward = True, "env_error", 0.0
            return []
        line.session.meta["errors"][-1] = bool(result.info.get("error"))
        ep.reward += result.reward
        ep.success = ep.success or result.success
        line.last_observation = result.observation
        if result.done or ep.success or ep.steps >= max_steps:
            for other in [line] + ([line.parent] if line.parent else []):
                self._close(env, other)
            ep.done, ep.reason = True, "success" if ep.success else ("done" if result.done else "max_steps")
            if line.parent is not None:
                line.session.success = self._met(env, line)
            return []
        if line.parent is not None and (self._met(env, line) or line.steps >= self.subagent_steps):
            return self._end_subagent(policy, env, line, result.observation)
        self._next_or_compact(policy, line, result.observation)
        return []

    def _next_or_compact(self, policy, line: _Line, observation: str) -> None:
        """Append ``observation``; on the main line, if the context would pass the budget, ask
        for the summary with it instead."""
        line.follow(policy, observation)
        tokens = line.session.num_tokens + len(line.pending)
        if self.compaction and line.parent is None and self.should_compact(tokens):
            line.summarizing = True
            line.follow(policy, f"{observation}\n{SUMMARY_REQUEST}")

    def _met(self, env, line: _Line) -> bool:
        try:
            return bool(env.goal_met(line.episode.state, line.goal))
        except Exception:
            return False

    def _fork(self, policy, env, line: _Line, goal: str) -> list[_Line]:
        ep = line.episode
        if not goal or ep.forks >= self.max_forks or len(ep.sessions) >= self.max_sessions:
            why = "no goal given" if not goal else "fork limit reached"
            line.follow(policy, f"Fork refused: {why}.")
            return []
        ep.forks += 1
        line.waiting = True
        prompt = self.subagent_prompt(ep.task_text, goal, line.last_observation)
        return [self._open(policy, env, ep, "subagent", prompt, parent=line, goal=goal)]

    def _end_subagent(self, policy, env, line: _Line, last: str) -> list[_Line]:
        met = self._met(env, line)
        line.session.success = met
        self._close(env, line)
        parent = line.parent
        parent.waiting = False
        outcome = "met" if met else "not met"
        self._next_or_compact(policy, parent, f"Subagent result ({line.goal}): goal {outcome}. {last}".strip())
        return []

    @staticmethod
    def _rollout(env, ep: _Ep) -> Rollout:
        for s in ep.sessions:
            if s.progress_after is None:
                s.progress_after = float(env.progress(ep.state))
            if s.goal and s.goal_progress_after is None:
                s.goal_progress_after = MultiSessionAgent._goal_progress(env, ep, s.goal)
        kinds = [s.kind for s in ep.sessions]
        return Rollout(ep.task.task_id, ep.group_id, ep.sessions, ep.reward, ep.success,
                       {"steps": ep.steps, "reason": ep.reason or "max_steps", "sessions": len(ep.sessions),
                        "compactions": ep.compactions, "forks": ep.forks,
                        "subagents": kinds.count("subagent")})
