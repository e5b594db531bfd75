"""MosaicPolicy: multi-session RL with session-aware advantages (docs/algorithms.md, Mosaic).

A rollout is several sessions (`main`, `compaction`, `subagent`). Each session's generated tokens
get ``A_ik = A~_i + beta * G_ik``:

- ``A~_i``, the trajectory term: with ``trajectory_term`` the session-aware advantage
  (`advantages.session_aware_advantages`: the GRPO advantage scaled by a within-class ranking of
  session counts, ``alpha``); without it the plain GRPO advantage, copied to every session.
- ``G_ik``, the session term (with ``session_term``): the session's marginal gain
  (``gain_fn(rollout, session)``; default `progress_gain`: a subagent's progress on its own goal,
  any other session's progress on the task, after minus before it) standardized per group and
  session kind (`advantages.session_shaping`).

Broadcasting, the paper's baseline, is this module with both terms off. Loss, KL and the rest as
`GRPOPolicy` (PPO-clip by default). `GRPOPolicy`'s per-turn credit works here too:
with ``error_baseline`` the turns after a session's first failed action (`MultiSessionAgent`
records ``meta["errors"]`` per call) have their trajectory term replaced by the error-aware one,
and the session term is added to every turn of the session as before.

Extension points for subclasses (docs/extending.md, examples/subclasses.py): `session_advantages`
(the whole session credit), `rollout_advantages` (the trajectory term), ``gain_fn`` (a callable
named in YAML), and `rollout_rewards` and `policy_loss` from `GRPOPolicy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lit_agents.algorithms.advantages import (
    SESSION_KINDS,
    session_aware_advantages,
    session_shaping,
)
from lit_agents.algorithms.collate import Row, session_rows
from lit_agents.modules.base import import_callable
from lit_agents.modules.grpo import GRPOPolicy
from lit_agents.policy import AgentPolicy
from lit_agents.types import Rollout, Session

GainFn = Callable[[Rollout, Session], float]


def progress_gain(rollout: Rollout, session: Session) -> float:
    """A session's marginal gain: progress after it minus before it (0 when not recorded).

    A subagent is scored on the goal it was sent for (``goal_progress_before/after``,
    `TextEnv.goal_progress`): a subagent sent for an ingredient that it got has done its job,
    however little that moved the whole task. Main and compaction sessions are scored on the
    task's progress (``progress_before/after``) over their whole span, which includes the time
    their subagents ran: a parent's gain counts what it delegated too, and its subagents' gains
    are standardized among subagents only (per session kind).
    """
    if session.goal_progress_before is not None:
        before, after = session.goal_progress_before, session.goal_progress_after
    else:
        before, after = session.progress_before, session.progress_after
    return float(after or 0.0) - float(before or 0.0)


class MosaicPolicy(GRPOPolicy):
    """Mosaic over multi-session rollouts; Broadcasting with both terms off.

    Args:
        policy: the model.
        trajectory_term: session-aware trajectory advantage (else GRPO broadcast to sessions).
        session_term: add the per-session shaping term.
        alpha: strength of the session-count ranking, in [0, 1).
        beta: weight of the session shaping term.
        gain_fn: ``(rollout, session) -> marginal gain`` (default `progress_gain`), or its dotted
            import path.
        **kwargs: see `GRPOPolicy` (loss, clip ranges, KL estimator, lr, ...).
    """

    def __init__(
        self,
        policy: AgentPolicy,
        trajectory_term: bool = True,
        session_term: bool = True,
        alpha: float = 0.5,
        beta: float = 0.5,
        gain_fn: GainFn | str = progress_gain,
        **kwargs: Any,
    ) -> None:
        super().__init__(policy, **kwargs)
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        self.trajectory_term, self.session_term = trajectory_term, session_term
        self.alpha, self.beta, self.gain_fn = alpha, beta, import_callable(gain_fn)

    def rollout_advantages(self, rollouts: list[Rollout]) -> Tensor:
        """The trajectory term, one per rollout: with ``trajectory_term`` the session-aware
        advantage (the group's advantage scaled by a ranking of session counts), else the plain
        outcome advantage (`GRPOPolicy.rollout_advantages`: Broadcasting)."""
        if not self.trajectory_term:
            return super().rollout_advantages(rollouts)
        groups = torch.tensor([r.group_id for r in rollouts])
        counts = torch.tensor([len(r.sessions) for r in rollouts])
        return session_aware_advantages(self.rollout_rewards(rollouts), counts, groups, self.alpha)

    def session_advantages(self, rollouts: list[Rollout]) -> list[list[float]]:
        """One advantage per session of each rollout: the trajectory term (`rollout_advantages`)
        plus ``beta`` times the session's shaped gain. Override for your own session credit."""
        if not rollouts:
            return []
        trajectory = self.rollout_advantages(rollouts)
        out = [[a] * len(r.sessions) for r, a in zip(rollouts, trajectory.tolist())]
        if self.session_term:
            gains, kinds, session_groups = [], [], []
            for r in rollouts:
                for s in r.sessions:
                    gains.append(self.gain_fn(r, s))
                    kinds.append(SESSION_KINDS.get(s.kind, len(SESSION_KINDS)))
                    session_groups.append(r.group_id)
            shaped = session_shaping(torch.tensor(gains, dtype=torch.float32), torch.tensor(kinds),
                                     torch.tensor(session_groups)).tolist()
            at = 0
            for advs in out:
                for k in range(len(advs)):
                    advs[k] += self.beta * shaped[at]
                    at += 1
        return out

    def rollouts_to_rows(self, rollouts: list[Rollout]) -> list[Row]:
        advantages: list[list[float | list[float]]] = list(self.session_advantages(rollouts))
        if rollouts and (self.hparams.error_baseline or self.hparams.turn_credit):
            # per-call credit (`GRPOPolicy.call_advantages`) moves the trajectory term of the calls
            # it re-credits (after a failed action; by progress per turn); the session term stays
            trajectory = self.rollout_advantages(rollouts)
            calls = self.call_advantages(rollouts, trajectory)
            advantages = [[[a + c - t for c in per_call] for a, per_call in zip(advs, session_calls)]
                          for advs, session_calls, t in zip(advantages, calls, trajectory.tolist())]
        keep = None
        if self.hparams.drop_zero_signal:  # rollouts whose every advantage is 0 teach nothing
            keep = [any(x != 0.0 for x in _flat(a)) for a in advantages]
        return session_rows(rollouts, advantages, self.hparams.max_row_tokens, keep=keep)


def _flat(advantages: list[float | list[float]]) -> list[float]:
    return [x for a in advantages for x in (a if isinstance(a, list) else [a])]
