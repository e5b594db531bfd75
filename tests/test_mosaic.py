"""MosaicPolicy's per-session advantages on hand-built multi-session rollouts."""

from __future__ import annotations

import pytest

from lit_agents.modules import MosaicPolicy
from lit_agents.policy import AgentPolicy
from lit_agents.types import Call, Rollout, Session


def _session(sid, kind, before, after, parent=None):
    call = Call(prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.1, -0.2])
    return Session(sid, kind, parent, 0 if parent is None else 1, [call],
                   progress_before=before, progress_after=after)


def _rollouts():
    # one group of three: a 1-session success, a 3-session success, a 2-session failure
    a = Rollout("t", 0, [_session(0, "main", 0.0, 1.0)], reward=1.0, success=True)
    b = Rollout("t", 0, [_session(0, "main", 0.0, 0.5), _session(1, "compaction", 0.5, 0.6),
                         _session(2, "subagent", 0.6, 1.0, parent=1)], reward=1.0, success=True)
    c = Rollout("t", 0, [_session(0, "main", 0.0, 0.2), _session(1, "compaction", 0.2, 0.2)], reward=0.0)
    return [a, b, c]


def test_a_subagent_gains_what_it_did_for_its_own_goal():
    """A subagent that got the ingredient it was sent for moved the task a little (0.6 -> 0.7)
    and its goal all the way (0.2 -> 1.0): it is credited with its goal. Other sessions keep
    the task's progress."""
    from lit_agents.modules.mosaic import progress_gain

    sub = _session(1, "subagent", 0.6, 0.7, parent=0)
    sub.goal, sub.goal_progress_before, sub.goal_progress_after = "craft 6 acacia planks", 0.2, 1.0
    rollout = Rollout("t", 0, [_session(0, "main", 0.0, 0.9), sub], reward=1.0, success=True)
    assert progress_gain(rollout, sub) == pytest.approx(0.8)
    assert progress_gain(rollout, rollout.sessions[0]) == pytest.approx(0.9)


@pytest.fixture(scope="module")
def policy(tiny_config):
    return AgentPolicy(tiny=tiny_config, lora_r=4)


def test_broadcasting_copies_the_grpo_advantage(policy):
    module = MosaicPolicy(policy, trajectory_term=False, session_term=False)
    advs = module.session_advantages(_rollouts())
    # rewards [1, 1, 0]: mean 2/3, sample std 0.57735 -> [0.57735, 0.57735, -1.1547]
    assert [len(a) for a in advs] == [1, 3, 2]
    assert advs[1] == pytest.approx([0.57735] * 3, abs=1e-4) and advs[2] == pytest.approx([-1.1547] * 2, abs=1e-4)


def test_trajectory_term_prefers_the_shorter_success(policy):
    module = MosaicPolicy(policy, trajectory_term=True, session_term=False, alpha=0.5)
    advs = module.session_advantages(_rollouts())
    assert advs[0][0] == pytest.approx(0.57735 * 1.5, abs=1e-4)  # K=1: u = +1
    assert advs[1][0] == pytest.approx(0.57735 * 0.5, abs=1e-4)  # K=3: u = -1
    assert advs[2][0] == pytest.approx(-1.1547, abs=1e-4)  # a class of one: unchanged


def test_session_term_standardizes_gains_per_kind(policy):
    module = MosaicPolicy(policy, trajectory_term=False, session_term=True, beta=0.5)
    advs = module.session_advantages(_rollouts())
    # main gains [1.0, 0.5, 0.2]: mean 0.5667, std 0.4041 -> G = [1.0724, -0.1650, -0.9074]
    assert advs[0][0] == pytest.approx(0.57735 + 0.5 * 1.0724, abs=1e-3)
    assert advs[2][0] == pytest.approx(-1.1547 - 0.5 * 0.9074, abs=1e-3)
    # compaction gains [0.1, 0.0] -> G = [+0.7071, -0.7071]; the lone subagent -> 0
    assert advs[1][1] == pytest.approx(0.57735 + 0.5 * 0.7071, abs=1e-3)
    assert advs[1][2] == pytest.approx(0.57735, abs=1e-4)


def test_rows_carry_each_sessions_advantage(policy):
    module = MosaicPolicy(policy)
    rows = module.rollouts_to_rows(_rollouts())
    assert len(rows) == 6
    advs = [a for r in module.session_advantages(_rollouts()) for a in r]
    for row, adv in zip(rows, advs):
        assert {round(a, 6) for a, m in zip(row.advantages, row.action_mask) if m} == {round(adv, 6)}
        assert not any(row.action_mask[:3])  # observations (e.g. a subagent's returned answer) are masked


def _turns(row):
    """The advantage of each call of a row built from `_session` calls (2 generated tokens each)."""
    return [x for x, m in zip(row.advantages, row.action_mask) if m][::2]


def test_error_baseline_moves_only_the_trajectory_term_of_turns_after_a_failed_action(policy):
    """MosaicPolicy(error_baseline=True): a turn after its session's first failed action gets the
    error-aware trajectory term (`advantages.error_baseline_advantages` on the session-aware
    advantages) plus the same session term as the rest of its session; other turns are unchanged."""
    import torch

    from lit_agents.algorithms.advantages import error_baseline_advantages

    rollouts = _rollouts()
    for r in rollouts:
        for s in r.sessions:
            s.calls = [s.calls[0]] * 3
            s.meta["errors"] = [False, False, False]
    rollouts[1].sessions[1].meta["errors"] = [True, False, False]  # a success that recovered
    rollouts[2].sessions[0].meta["errors"] = [False, True, True]  # a failure
    plain = MosaicPolicy(policy).session_advantages(rollouts)
    module = MosaicPolicy(policy, error_baseline=True)
    trajectory = module.rollout_advantages(rollouts)
    after = error_baseline_advantages(torch.tensor([1.0, 1.0, 0.0]), torch.zeros(3, dtype=torch.long), trajectory,
                                      torch.tensor([False, True, True])).tolist()
    t = trajectory.tolist()
    turns = [_turns(row) for row in module.rollouts_to_rows(rollouts)]
    assert turns[0] == pytest.approx([plain[0][0]] * 3)
    assert turns[1] == pytest.approx([plain[1][0]] * 3)  # no error in this session
    assert turns[2] == pytest.approx([plain[1][1]] + [plain[1][1] - t[1] + after[1]] * 2)
    assert turns[4] == pytest.approx([plain[2][0]] * 2 + [plain[2][0] - t[2] + after[2]])
    assert turns[5] == pytest.approx([plain[2][1]] * 3)
    assert t[2] < after[2] < 0  # b = 1/2 (the errored rollouts' mean) above the group's 2/3: pushed down less
    rollouts[0].sessions[0].meta.pop("errors")
    with pytest.raises(ValueError, match="error_baseline needs"):
        module.rollouts_to_rows(rollouts)
