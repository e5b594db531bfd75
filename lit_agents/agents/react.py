"""ReAct loop: G attempts per task, all live episodes batched through the engine each step.

Each episode is one `main` session: the first prompt is the env's instructions plus its first
observation; every turn the policy writes one action (a completion closed by the chat format's end
token), the env answers with an observation, and only the new tokens are prefilled next turn
(the engine keeps each session's KV cache). The session's ``meta["progress"]`` holds the env's
progress score at the start and after every action (1 once solved), ``meta["errors"]`` whether
each action failed (the env's ``info["error"]``): per-turn credit (`GRPOPolicy`'s ``turn_credit``
and ``error_baseline``) reads them. Subclass it for a custom action format: override
`parse_action` (completion text -> env action), `format_action` (env action -> the completion a
demonstration writes) and `system_text` (the system message that explains the format);
`observation_text` changes what the model sees (examples/subclasses.py, docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from lit_agents.agents.base import Agent, Cursor, env_error_session, reset_env, sample_turns, step_env, write_turn
from lit_agents.envs.base import TextEnv, expert_episodes
from lit_agents.policy import AgentPolicy
from lit_agents.types import Episode, Rollout, StepResult, Task


@dataclass(kw_only=True)
class _Episode(Cursor):
    task: Task
    group_id: int
    state: Any = None
    steps: int = 0
    reward: float = 0.0
    success: bool = False
    done: bool = False
    reason: str = ""


class ReActAgent(Agent):
    """Think-act loop over a text environment, batched across episodes.

    Args:
        max_new_tokens: longest action (tokens) per turn.
        temperature: sampling temperature for training rollouts.
        top_p: nucleus sampling for training rollouts.
        max_steps: actions per episode; ``None`` = the env's ``max_steps``.
        max_context_tokens: an episode whose context would pass this ends (reward 0, ``meta.reason``
            = ``"context"``) instead of crashing the model.
        show_progress: progress bars over turns (live episodes, successes so far) and each
            turn's decode steps.
        system_prompt: the system message; ``None`` = the env's ``instructions``, ``""`` = none
            (a model trained from scratch on demonstrations does not need them).
    """

    def __init__(
        self,
        max_new_tokens: int = 48,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_steps: int | None = None,
        max_context_tokens: int = 4096,
        show_progress: bool = False,
        system_prompt: str | None = None,
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.max_steps = max_steps
        self.max_context_tokens = max_context_tokens
        self.show_progress = show_progress
        self.system_prompt = system_prompt

    # ------------------------------------------------------------------ extension points
    def parse_action(self, completion: str) -> str:
        """The env action in a decoded completion (default: its first line)."""
        return completion.strip().split("\n", 1)[0].strip()

    def format_action(self, action: str) -> str:
        """The completion that writes env action ``action``: the inverse of `parse_action`, used
        for demonstrations (`replay`, `expert_rollout`). Default: the action itself."""
        return action

    def system_text(self, env: TextEnv) -> str:
        """The system message of every episode: ``system_prompt``, else the env's instructions."""
        return env.instructions if self.system_prompt is None else self.system_prompt

    def observation_text(self, result: StepResult) -> str:
        """What the model sees after an action (default: the env's observation)."""
        return result.observation

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
        episodes = [
            self._start(policy, env, task, group_offset + i) for i, task in enumerate(tasks) for _ in range(group_size)
        ]
        params = self.sampling(policy, self.max_new_tokens, greedy=greedy)
        engine, generator = self.engine(policy, seed)
        live = [e for e in episodes if not e.done]
        bar = tqdm(desc="turns", unit="turn", disable=not self.show_progress)
        while live:
            texts = sample_turns(policy, engine, live, params, generator, policy_version)
            for episode, text in zip(live, texts):
                self._advance(policy, env, episode, text)
            live = [e for e in live if not e.done]
            bar.set_postfix(
                live=f"{len(live)}/{len(episodes)}", success=sum(e.success for e in episodes), refresh=False
            )
            bar.update(1)
        bar.close()
        return [self._finish(e) for e in episodes]

    def _start(self, policy: AgentPolicy, env: TextEnv, task: Task, group_id: int) -> _Episode:
        reset = reset_env(env, task)
        if isinstance(reset, Exception):
            return _Episode(task=task, group_id=group_id, session=env_error_session(reset), done=True,
                            reason="env_error")
        state, observation = reset
        budget = self.context_limit(policy, self.max_context_tokens) - self.max_new_tokens
        episode = _Episode(task=task, group_id=group_id, state=state, pending_text=observation,
                           pending=self.fit_prompt(policy.chat.start(self.system_text(env), observation), budget))
        episode.session.meta.update(progress=[float(env.progress(state))], errors=[])
        return episode

    def _advance(self, policy: AgentPolicy, env: TextEnv, episode: _Episode, text: str) -> None:
        """Apply the turn just recorded: step the env, then queue the observation or end."""
        episode.steps += 1
        result = step_env(env, episode.state, self.parse_action(text), episode.task)
        if isinstance(result, Exception):
            episode.done, episode.reason, episode.reward = True, "env_error", 0.0
            return
        episode.reward += result.reward
        episode.success = episode.success or result.success
        episode.session.meta["progress"].append(1.0 if episode.success else float(env.progress(episode.state)))
        episode.session.meta["errors"].append(bool(result.info.get("error")))
        episode.follow(policy, self.observation_text(result))
        if result.done or episode.success:
            episode.done, episode.reason = True, "success" if episode.success else "done"
        elif episode.steps >= (self.max_steps or env.max_steps):
            episode.done, episode.reason = True, "max_steps"
        elif episode.session.num_tokens + len(episode.pending) + self.max_new_tokens > self.context_limit(
            policy, self.max_context_tokens
        ):
            episode.done, episode.reason = True, "context"

    @staticmethod
    def _finish(episode: _Episode) -> Rollout:
        return Rollout(
            task_id=episode.task.task_id,
            group_id=episode.group_id,
            sessions=[episode.session],
            reward=episode.reward,
            success=episode.success,
            meta={"steps": episode.steps, "reason": episode.reason},
        )

    # ------------------------------------------------------------------ demonstrations
    def expert_rollout(self, policy: AgentPolicy, env: TextEnv, task: Task, group_id: int = 0) -> Rollout:
        """The env's expert playing ``task``, tokenized exactly as the policy's own turns are."""
        (episode,) = expert_episodes(env, [task])
        return self.replay(policy, env, episode, group_id)

    def replay(self, policy: AgentPolicy, env: TextEnv, episode: Episode, group_id: int = 0) -> Rollout:
        """A recorded text episode (a demonstration) tokenized as the policy's own turns would be:
        the same system prompt, chat format and observation text as `run`."""
        cursor, reward = Cursor(), 0.0
        cursor.start(policy, self.system_text(env), episode.observation)
        for action, result in episode.steps:
            write_turn(policy, cursor, self.format_action(action))
            reward += result.reward
            cursor.follow(policy, self.observation_text(result))
        return Rollout(
            task_id=episode.task.task_id,
            group_id=group_id,
            sessions=[cursor.session],
            reward=reward,
            success=episode.success,
            meta={"steps": len(episode.steps), "reason": "success" if episode.success else "max_steps"},
        )
