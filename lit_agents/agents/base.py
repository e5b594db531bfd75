"""The `Agent` interface every loop implements, and the core the four loops share.

The core: a `Cursor` is one live session (its calls, the tokens to prefill before its next turn,
the engine's KV context, whether the last turn was cut off); `sample_turns` runs one batched model
call for many cursors and records each call; `write_turn` records a turn an expert wrote;
`reset_env` and `step_env` are the guarded env calls (an env error fails that episode only,
with a warning, never the run). ReAct, multi-session, hierarchical and recursive loops are built
on them, and keep every per-run thing in their own episode records, never on the agent object.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_agents.generation import GenerationEngine, SamplingParams
from lit_agents.generation.vllm_engine import VLLMEngine
from lit_agents.types import Call, Session

if TYPE_CHECKING:
    from lit_agents.envs.base import TextEnv
    from lit_agents.policy import AgentPolicy
    from lit_agents.types import Episode, Rollout, StepResult, Task


@dataclass(kw_only=True)
class Cursor:
    """One live session of an agent loop.

    Attributes:
        session: where its calls are recorded.
        pending: the tokens to prefill before its next turn (a prompt or an observation).
        pending_text: their text (``Call.prompt_text``).
        context: the engine's context (KV cache) after the last turn; None = a fresh one.
        cut: the last turn stopped at ``max_new_tokens`` without the end-of-turn token.
    """

    session: Session = field(default_factory=Session)
    pending: list[int] = field(default_factory=list)
    pending_text: str = ""
    context: Any = None
    cut: bool = False

    def start(self, policy: AgentPolicy, system: str, text: str) -> None:
        """Open a fresh context: the system message and the first user message ``text``."""
        self.pending, self.pending_text, self.context, self.cut = policy.chat.start(system, text), text, None, False

    def follow(self, policy: AgentPolicy, text: str) -> None:
        """Queue ``text`` (an observation) as the next turn's prompt; a cut-off turn is closed
        first, as the chat template would have closed it."""
        self.pending_text = text
        self.pending = ([policy.chat.end_id] if self.cut else []) + policy.chat.next(text)


def sample_turns(policy: AgentPolicy, engine: GenerationEngine | VLLMEngine, cursors: Sequence[Cursor],
                 params: SamplingParams, generator: torch.Generator, version: int = 0,
                 role: str | None = None) -> list[str]:
    """One batched model call: every cursor's pending tokens prefilled and one turn sampled.
    Each turn is recorded as a `Call` in its cursor's session (``role``: default the policy's
    active adapter); returns the decoded texts."""
    role = role or policy.active_role or "default"
    outs = engine.generate([c.context for c in cursors], [c.pending for c in cursors], params, generator)
    texts = []
    for cursor, out in zip(cursors, outs):
        text = policy.chat.decode_completion(out.token_ids)
        cursor.session.calls.append(Call(cursor.pending, list(out.token_ids), list(out.logprobs), role, version,
                                         cursor.pending_text, text))
        cursor.context = out.context
        cursor.cut = out.finish_reason == "length"
        texts.append(text)
    return texts


def write_turn(policy: AgentPolicy, cursor: Cursor, text: str, role: str | None = None) -> str:
    """Record a turn that was written, not sampled (an expert's), as `sample_turns` records a
    sampled one; returns ``text``."""
    cursor.session.calls.append(written_call(policy, cursor.pending, cursor.pending_text, text, role))
    cursor.cut = False
    return text


def reset_env(env: TextEnv, task: Task) -> tuple[Any, str] | Exception:
    """``env.reset(task)``, or the error it raised (warned): that episode fails, the run goes on."""
    try:
        return env.reset(task)
    except Exception as err:  # an env bug fails this episode only, never the run
        rank_zero_warn(f"environment error resetting {task.task_id}: {err!r}")
        return err


def step_env(env: TextEnv, state: Any, action: str, task: Task) -> StepResult | Exception:
    """``env.step(state, action)``, or the error it raised (warned): that episode ends."""
    try:
        return env.step(state, action)
    except Exception as err:  # an env bug fails this episode only, never the run
        rank_zero_warn(f"environment error on {task.task_id}: {err!r}")
        return err


def env_error_session(err: Exception, **meta: Any) -> Session:
    """The one session of an episode whose env failed before its first turn."""
    return Session(meta={**meta, "error": repr(err)})


def written_call(policy: AgentPolicy, prompt_ids: list[int], prompt_text: str, text: str,
                 role: str | None = None) -> Call:
    """A call whose completion ``text`` was written, not sampled (demonstrations, scripted
    experts): tokenized as the policy would write it, sampler log-probs 0."""
    ids = policy.chat.completion(text)
    return Call(prompt_ids, ids, [0.0] * len(ids), role or policy.active_role or "default", 0, prompt_text, text)


class Agent(ABC):
    """How a policy plays an environment: batched live rollouts, and demonstrations replayed in
    exactly the token layout of live rollouts."""

    #: sampling temperature of training rollouts (the modules score log-probs at it)
    temperature: float = 1.0
    top_p: float = 1.0
    show_progress: bool = False

    def sampling(self, policy: AgentPolicy, max_new_tokens: int, *, greedy: bool,
                 temperature: float | None = None) -> SamplingParams:
        """Sampling settings of one kind of call: greedy, or ``temperature`` (default: the
        agent's) with the agent's top-p; stops at the chat format's end of turn."""
        temp = self.temperature if temperature is None else temperature
        return SamplingParams(temperature=0.0 if greedy else temp, top_p=1.0 if greedy else self.top_p,
                              max_new_tokens=max_new_tokens, stop_token_ids=policy.chat.stop_ids)

    def engine(self, policy: AgentPolicy, seed: int) -> tuple[GenerationEngine | VLLMEngine, torch.Generator]:
        """The policy's rollout engine (`AgentPolicy(engine=...)`: the built-in one over its model,
        or its vLLM engine) and a seeded generator on its device."""
        device = next(policy.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        if policy.engine == "vllm":
            return policy.vllm_engine(self.show_progress), generator
        # on a GPU: CUDA-graph decode, compiled as one step when the policy compiles its layers
        engine = GenerationEngine(policy.model, pad_token_id=policy.pad_id, tokenizer=policy.tokenizer,
                                  show_progress=self.show_progress,
                                  compile=policy.compiled and device.type == "cuda")
        return engine, generator

    @staticmethod
    def context_limit(policy: AgentPolicy, limit: int | None = None) -> int:
        """Tokens a session may hold: ``limit`` capped by the model's position limit."""
        config = policy.model.config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        caps = [c for c in (limit, positions) if c]
        return min(caps) if caps else 1 << 30

    @staticmethod
    def fit_prompt(ids: list[int], budget: int) -> list[int]:
        """A prompt cut to ``budget`` tokens by rule: keep its first and last halves (the task
        and instructions open a prompt, the latest observation closes it); unchanged if it fits."""
        if len(ids) <= budget:
            return ids
        budget = max(budget, 2)
        head = budget // 2
        rank_zero_warn(f"a prompt of {len(ids)} tokens was cut to {budget} (its middle dropped) to fit the context")
        return ids[:head] + ids[len(ids) - (budget - head) :]

    @abstractmethod
    def run(self, policy: AgentPolicy, env: TextEnv, tasks: list[Task], group_size: int = 1, *,
            greedy: bool = False, seed: int = 0, group_offset: int = 0, policy_version: int = 0) -> list[Rollout]:
        """Play ``group_size`` episodes of every task; rollouts grouped by task (group ids from
        ``group_offset``)."""

    @abstractmethod
    def replay(self, policy: AgentPolicy, env: TextEnv, episode: Episode, group_id: int = 0) -> Rollout:
        """A recorded text episode as the rollout a live run would have produced."""

    @abstractmethod
    def expert_rollout(self, policy: AgentPolicy, env: TextEnv, task: Task, group_id: int = 0) -> Rollout:
        """The env's expert playing ``task``, as a rollout."""
