"""Multi2's hierarchical loop: a planner (System 1) writes subgoals, an executor (System 2) acts.

One backbone, one LoRA adapter per role. Per episode:

- the **planner** (adapter ``planner``) sees the task, the latest observation and the actions
  taken for the previous subgoal, and writes the next subgoal. Every planner call is its own
  one-call session (a fresh prompt: the planner's context never grows);
- the **executor** (adapter ``executor``) sees the task, the latest observation and the subgoal,
  and writes ``<action>; done`` or ``<action>; continue``. One session per subgoal, append-only
  across its steps. ``done`` (or the subgoal being met, with ``end_on_met``, or
  ``max_subgoal_steps``) returns control to the planner.

Rewards (docs/algorithms.md, Multi2): an executor step earns 1 when it completes its subgoal (checked
by ``env.goal_met``) plus the environment's reward. Each executor session records per step
``meta["rewards"]`` and ``meta["dones"]`` (1 on the subgoal episode's last step), its subgoal as
``goal`` and whether it was met as ``success``: the transitions
System 2's actor-critic learns from. All live episodes are batched: each loop step runs one
batched call for the episodes that are planning (planner adapter) and one for those acting.

Demonstrations come from the env's subgoal experts (``expert_subgoal``,
``expert_subgoal_action``), optionally epsilon-noisy (``env.random_action`` injected) so that
offline RL has something to choose between; they are text `Episode`s with per-step subgoal
annotations (``Episode.subgoals``), replayed into sessions exactly like live rollouts.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

from lit_agents.agents.base import Agent, Cursor, env_error_session, reset_env, sample_turns, step_env, write_turn
from lit_agents.envs.base import TextEnv
from lit_agents.policy import AgentPolicy
from lit_agents.types import Call, Episode, Rollout, Session, StepResult, Task

DONE, CONTINUE = "done", "continue"


@dataclass(kw_only=True)
class _Episode(Cursor):
    """One episode; as a cursor, its current executor session."""

    task: Task
    group_id: int
    state: Any
    task_text: str
    observation: str = ""
    sessions: list[Session] = field(default_factory=list)
    planning: bool = True
    subgoal: str = ""
    previous: tuple[str, list[str], bool] | None = None  # (subgoal, its actions, met)
    actions: list[str] = field(default_factory=list)
    steps: int = 0
    reward: float = 0.0
    success: bool = False
    done: bool = False
    reason: str = ""


class HierarchicalAgent(Agent):
    """Planner/executor loop over a text environment with checkable subgoals.

    Args:
        max_new_tokens: longest executor completion (tokens).
        plan_tokens: longest planner completion (tokens).
        temperature: executor sampling temperature in training rollouts.
        planner_temperature: planner sampling temperature (0 = greedy: Multi2 freezes System 1
            while System 2 learns, so its subgoals need not explore).
        top_p: nucleus sampling of both roles.
        max_steps: environment actions per episode; ``None`` = the env's ``max_steps``.
        max_subgoals: planner calls per episode.
        max_subgoal_steps: executor actions per subgoal.
        end_on_met: end a subgoal as soon as it is met, whatever the flag says.
        planner_role, executor_role: the adapters of the two roles.
        planner_system, executor_system: system prompts (empty: a model trained from scratch on
            demonstrations needs none).
        show_progress: a progress bar over decode steps.
        expert_planner, expert_executor: the env's subgoal expert (``expert_subgoal``) writes
            the subgoals, or its executor (``expert_subgoal_action``) the actions, instead of the
            model, in live episodes: ablations that tell which role an agent's failures come
            from (`research/multi2_roles.py`). Expert turns are recorded with log-prob 0, as
            demonstrations are; an expert executor with nothing to do for a subgoal (met already,
            unparsable, not in the goal's plan) answers ``inventory; done``. In training
            rollouts only ``expert_planner`` fits System 2's online stage (its planner is
            frozen): the executor still samples what it learns from.
    """

    def __init__(
        self,
        max_new_tokens: int = 40,
        plan_tokens: int = 24,
        temperature: float = 1.0,
        planner_temperature: float = 0.0,
        top_p: float = 1.0,
        max_steps: int | None = None,
        max_subgoals: int = 12,
        max_subgoal_steps: int = 8,
        end_on_met: bool = True,
        planner_role: str = "planner",
        executor_role: str = "executor",
        planner_system: str = "",
        executor_system: str = "",
        show_progress: bool = False,
        expert_planner: bool = False,
        expert_executor: bool = False,
    ) -> None:
        self.max_new_tokens, self.plan_tokens = max_new_tokens, plan_tokens
        self.temperature, self.planner_temperature, self.top_p = temperature, planner_temperature, top_p
        self.max_steps, self.max_subgoals, self.max_subgoal_steps = max_steps, max_subgoals, max_subgoal_steps
        self.end_on_met = end_on_met
        self.planner_role, self.executor_role = planner_role, executor_role
        self.planner_system, self.executor_system = planner_system, executor_system
        self.show_progress = show_progress
        self.expert_planner, self.expert_executor = expert_planner, expert_executor

    # ------------------------------------------------------------------ text formats (override)
    def planner_prompt(self, task_text: str, observation: str, previous: tuple[str, list[str], bool] | None) -> str:
        """Task + latest observation + the previous subgoal's actions and outcome."""
        if previous is None:
            return task_text
        subgoal, actions, met = previous
        done = DONE if met else "not done"
        return f"{task_text}\n\nPrevious subgoal: {subgoal} ({done})\nActions: {'; '.join(actions)}\n{observation}"

    def executor_prompt(self, task_text: str, observation: str, subgoal: str) -> str:
        """Task + latest observation + the subgoal."""
        middle = f"\n{observation}" if observation else ""
        return f"{task_text}\n{middle}\nSubgoal: {subgoal}"

    @staticmethod
    def format_action(action: str, done: bool) -> str:
        return f"{action}; {DONE if done else CONTINUE}"

    @staticmethod
    def parse_action(completion: str) -> tuple[str, bool]:
        """``(action, done)`` from ``<action>; <flag>`` (no flag: continue)."""
        line = completion.strip().split("\n", 1)[0]
        action, sep, flag = line.rpartition(";")
        if not sep:
            return line.strip(), False
        return action.strip(), flag.strip().lower() == DONE

    @staticmethod
    def parse_subgoal(completion: str) -> str:
        return completion.strip().split("\n", 1)[0].strip()

    # ------------------------------------------------------------------ rollouts
    def run(
        self,
        policy: AgentPolicy,
        env: TextEnv,
        tasks: list[Task],
        group_size: int = 1,
        *,
        greedy: bool = False,
        seed: int = 0,
        group_offset: int = 0,
        policy_version: int = 0,
    ) -> list[Rollout]:
        """Play ``group_size`` episodes of every task; returns rollouts grouped by task."""
        episodes = []
        for i, task in enumerate(tasks):
            for _ in range(group_size):
                reset = reset_env(env, task)
                if isinstance(reset, Exception):
                    episodes.append(_Episode(task=task, group_id=group_offset + i, state=None, task_text="",
                                             sessions=[env_error_session(reset)], done=True, reason="env_error"))
                else:
                    episodes.append(_Episode(task=task, group_id=group_offset + i, state=reset[0], task_text=reset[1]))
        plan_params = self.sampling(policy, self.plan_tokens, greedy=greedy, temperature=self.planner_temperature)
        act_params = self.sampling(policy, self.max_new_tokens, greedy=greedy)
        engine, generator = self.engine(policy, seed)
        live = [e for e in episodes if not e.done]
        while live:
            planners = [e for e in live if e.planning]
            if planners:
                cursors = [self._planner_cursor(policy, e) for e in planners]
                if self.expert_planner:
                    texts = [write_turn(policy, c, env.expert_subgoal(e.state), self.planner_role)
                             for e, c in zip(planners, cursors)]
                else:
                    with _as_role(policy, self.planner_role):
                        texts = sample_turns(policy, engine, cursors, plan_params, generator, policy_version,
                                             self.planner_role)
                for e, cursor, text in zip(planners, cursors, texts):
                    self._plan(policy, e, cursor.session.calls[0], self.parse_subgoal(text))
            actors = [e for e in live if not e.planning and not e.done]
            if actors:
                if self.expert_executor:
                    texts = [write_turn(policy, e, self._expert_action(env, e), self.executor_role) for e in actors]
                else:
                    with _as_role(policy, self.executor_role):
                        texts = sample_turns(policy, engine, actors, act_params, generator, policy_version,
                                             self.executor_role)
                for e, text in zip(actors, texts):
                    action, flag = self.parse_action(text)
                    result = step_env(env, e.state, action, e.task)
                    if isinstance(result, Exception):
                        self._env_error(e)
                        continue
                    met = _goal_met(env, e.state, e.subgoal)
                    self._act(policy, e, action, flag, result, met, self.max_steps or env.max_steps)
            live = [e for e in live if not e.done]
        return [self._finish(e) for e in episodes]

    def _expert_action(self, env: TextEnv, e: _Episode) -> str:
        """The env's executor expert's turn for ``e``'s subgoal (``inventory; done`` when it has
        nothing to do: control goes back to the planner)."""
        action = env.expert_subgoal_action(e.state, e.subgoal)
        return self.format_action(action, action == "inventory")

    def _planner_cursor(self, policy: AgentPolicy, e: _Episode) -> Cursor:
        """A planner call's cursor: a fresh context on the task, the latest observation and the
        previous subgoal (every planner call is its own session)."""
        cursor = Cursor()
        cursor.start(policy, self.planner_system, self.planner_prompt(e.task_text, e.observation, e.previous))
        return cursor

    def _plan(self, policy: AgentPolicy, e: _Episode, call: Call, subgoal: str) -> None:
        """Record a planner call and open the executor session of its subgoal."""
        e.sessions.append(Session(len(e.sessions), calls=[call], goal=subgoal, meta={"role": self.planner_role}))
        e.subgoal, e.actions, e.planning = subgoal, [], False
        e.start(policy, self.executor_system, self.executor_prompt(e.task_text, e.observation, subgoal))
        e.session = Session(len(e.sessions), goal=subgoal, success=False,
                            meta={"role": self.executor_role, "rewards": [], "dones": []})
        e.sessions.append(e.session)

    def _act(self, policy: AgentPolicy, e: _Episode, action: str, flag: bool, result: StepResult,
             met: bool, max_steps: int) -> None:
        """Apply an executor step (its call already recorded in the subgoal's session); close the
        subgoal (and maybe the episode) when it ends."""
        session = e.session
        e.actions.append(action)
        e.steps += 1
        e.reward += result.reward
        e.success = e.success or result.success
        e.observation = result.observation
        newly = met and not session.success
        session.success = met
        session.meta["rewards"].append(float(newly) + result.reward)
        ends_episode = result.done or e.success or e.steps >= max_steps
        ends_subgoal = ends_episode or flag or (met and self.end_on_met) or len(e.actions) >= self.max_subgoal_steps
        session.meta["dones"].append(float(ends_subgoal))
        session.reward = float(met)
        if ends_episode or (ends_subgoal and sum(s.meta["role"] == self.planner_role for s in e.sessions)
                            >= self.max_subgoals):
            e.done = True
            e.reason = "success" if e.success else ("done" if result.done else "max_steps")
        elif ends_subgoal:
            e.previous, e.planning = (e.subgoal, list(e.actions), met), True
        else:
            e.follow(policy, result.observation)

    @staticmethod
    def _env_error(e: _Episode) -> None:
        """The env raised on the executor's last action: that action (its call already recorded)
        gets reward 0 and ends its subgoal and the episode, so every executor call keeps its
        reward and done (`collate.transition_rows`)."""
        e.session.meta["rewards"].append(0.0)
        e.session.meta["dones"].append(1.0)
        e.done, e.reason, e.reward = True, "env_error", 0.0

    @staticmethod
    def _finish(e: _Episode) -> Rollout:
        return Rollout(e.task.task_id, e.group_id, e.sessions, e.reward, e.success,
                       {"steps": e.steps, "reason": e.reason, "subgoals": len(e.sessions) // 2})

    # ------------------------------------------------------------------ demonstrations
    def expert_episode(self, env: TextEnv, task: Task, epsilon: float = 0.0, seed: int = 0) -> Episode:
        """The env's subgoal experts on ``task`` as a text episode; with probability ``epsilon``
        an executor action is replaced by ``env.random_action`` (flagged ``continue``)."""
        rng = random.Random(f"{task.task_id}/{seed}")
        state, first = env.reset(task)
        episode = Episode(task, first, env=f"{type(env).__module__}.{type(env).__qualname__}", subgoals=[])
        max_steps = env.max_steps  # the env's limit, not the agent's (as ReActAgent's expert)
        for _ in range(max_steps):
            subgoal = env.expert_subgoal(state)
            for k in range(self.max_subgoal_steps):
                noisy = epsilon > 0 and rng.random() < epsilon
                action = env.random_action(state, rng) if noisy else env.expert_subgoal_action(state, subgoal)
                result = env.step(state, action)
                met = _goal_met(env, state, subgoal)
                episode.steps.append((action, result))
                episode.subgoals.append({"subgoal": subgoal, "start": k == 0, "flag": met})
                episode.success = episode.success or result.success
                if result.done or episode.success or len(episode.steps) >= max_steps or met:
                    break
            if result.done or episode.success or len(episode.steps) >= max_steps:
                break
        return episode

    def expert_rollout(self, policy: AgentPolicy, env: TextEnv, task: Task, group_id: int = 0) -> Rollout:
        return self.replay(policy, env, self.expert_episode(env, task), group_id)

    def replay(self, policy: AgentPolicy, env: TextEnv, episode: Episode, group_id: int = 0) -> Rollout:
        """A recorded hierarchical episode as the sessions a live run would have produced
        (sampler log-probs 0: they are demonstrations). Needs ``episode.subgoals``."""
        if not episode.subgoals or len(episode.subgoals) != len(episode.steps):
            raise ValueError(f"episode {episode.task.task_id} has no per-step subgoal annotations")
        e = _Episode(task=episode.task, group_id=group_id, state=None, task_text=episode.observation)
        for (action, result), note in zip(episode.steps, episode.subgoals):
            if note["start"]:
                if e.sessions:
                    e.previous = (e.subgoal, list(e.actions), bool(e.sessions[-1].success))
                planner = self._planner_cursor(policy, e)
                write_turn(policy, planner, note["subgoal"], self.planner_role)
                self._plan(policy, e, planner.session.calls[0], note["subgoal"])
            write_turn(policy, e, self.format_action(action, bool(note["flag"])), self.executor_role)
            met = bool(note.get("met", note["flag"]))
            self._act(policy, e, action, bool(note["flag"]), result, met, len(episode.steps) + 1)
        e.success = episode.success
        return self._finish(e)


def _as_role(policy: AgentPolicy, role: str):
    """The role's adapter; a policy without adapters (full fine-tuning) plays every role."""
    return policy.role(role) if policy.roles else contextlib.nullcontext()


def _goal_met(env: TextEnv, state: Any, subgoal: str) -> bool:
    try:
        return bool(env.goal_met(state, subgoal))
    except Exception:  # an unparsable subgoal from the model is simply not met
        return False
