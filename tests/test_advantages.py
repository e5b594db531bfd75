"""Baseline advantages against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from lit_agents.algorithms.advantages import (
    call_gains,
    error_baseline_advantages,
    group_has_signal,
    group_stats,
    grpo_advantages,
    rloo_advantages,
    turn_credit,
    zero_signal_fraction,
)

# Three groups: {1, 0, 0, 1} (signal), {1, 1} (constant), {0} (single).
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 2])


def test_grpo_binary_groups() -> None:
    # group 0: mean 0.5, sample std sqrt((4 * 0.25) / 3) = sqrt(1/3) = 0.5773503,
    # so A = +-0.5 / 0.5773503 = +-0.8660254; groups 1 and 2 give exactly 0.
    adv = grpo_advantages(REWARDS, GROUPS)
    expected = torch.tensor([0.8660254, -0.8660254, -0.8660254, 0.8660254, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert adv[4:].eq(0).all()
    assert adv.dtype == torch.float32


def test_grpo_graded_rewards_and_scattered_group_ids() -> None:
    # group 7 = {1, 2, 4}: mean 7/3, deviations -4/3, -1/3, 5/3, squares sum 42/9,
    # sample var 21/9 = 7/3, std 1.5275252 -> A = -0.8728716, -0.2182179, 1.0910895.
    # group 3 = {0.1, 0.1}: constant -> 0 exactly (no rounding leak).
    rewards = torch.tensor([1.0, 0.1, 2.0, 0.1, 4.0], dtype=torch.float64)
    groups = torch.tensor([7, 3, 7, 3, 7])
    adv = grpo_advantages(rewards, groups)
    expected = torch.tensor([-0.8728716, 0.0, -0.2182179, 0.0, 1.0910895], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    assert adv[1] == 0 and adv[3] == 0


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
def test_a_constant_group_of_non_integer_rewards_gives_exact_zeros(fn) -> None:
    """Three rewards of 0.1: their float mean is not exactly 0.1 (the deviations are ~1e-11, which
    a std of ~0 would blow up), so only the constant-group guard gives exact zeros; and a group
    with no signal must read as none (Mosaic keeps a group where any advantage is != 0)."""
    rewards, groups = torch.tensor([0.1, 0.1, 0.1, 0.0, 1.0], dtype=torch.float64), torch.tensor([0, 0, 0, 1, 1])
    adv = fn(rewards, groups)
    assert adv[:3].eq(0).all() and adv[3:].ne(0).all(), adv
    assert group_has_signal(rewards, groups).tolist() == [False, False, False, True, True]


def test_grpo_eps_enters_denominator() -> None:
    # {0, 2}: mean 1, sample std sqrt(2) = 1.4142136; eps 1 -> A = +-1 / 2.4142136 = +-0.4142136.
    adv = grpo_advantages(torch.tensor([0.0, 2.0]), torch.tensor([0, 0]), eps=1.0)
    torch.testing.assert_close(adv, torch.tensor([-0.4142136, 0.4142136]), atol=1e-6, rtol=0)


def test_grpo_integer_rewards_and_empty() -> None:
    adv = grpo_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]))
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([0.7071068, -0.7071068]), atol=1e-5, rtol=0)
    empty = grpo_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,)


def test_rloo_hand_values() -> None:
    # group 0: R=1 -> 1 - (1+0+0)/3 = 2/3; R=0 -> 0 - (1+0+1)/3 = -2/3. Others 0.
    adv = rloo_advantages(REWARDS, GROUPS)
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    # {1, 2, 4}: 1 - 3 = -2; 2 - 2.5 = -0.5; 4 - 1.5 = 2.5.
    graded = rloo_advantages(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([5, 5, 5]))
    torch.testing.assert_close(graded, torch.tensor([-2.0, -0.5, 2.5]))


def test_zero_signal_fraction_and_mask() -> None:
    # groups 1 (constant) and 2 (single) of three carry no signal.
    assert zero_signal_fraction(REWARDS, GROUPS) == pytest.approx(2 / 3)
    assert zero_signal_fraction(torch.zeros(0), torch.zeros(0, dtype=torch.long)) == 0.0
    has = group_has_signal(REWARDS, GROUPS)
    assert has.tolist() == [True, True, True, True, False, False, False]


def test_group_stats_fields() -> None:
    stats = group_stats(REWARDS, GROUPS)
    assert stats.mean.tolist() == [0.5] * 4 + [1.0, 1.0, 0.0]
    assert stats.size.tolist() == [4, 4, 4, 4, 2, 2, 1]
    assert stats.total.tolist() == [2.0] * 4 + [2.0, 2.0, 0.0]
    assert stats.std[0].item() == pytest.approx(math.sqrt(1 / 3))
    assert stats.std[4:].tolist() == [0.0, 0.0, 0.0]
    assert stats.constant.tolist() == [False] * 4 + [True] * 3


def test_input_validation() -> None:
    with pytest.raises(ValueError, match="integer"):
        grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match="shape"):
        rloo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.long))


# ---------------------------------------------------------------- Mosaic (hand-computed)


def test_broadcast_is_grpo_per_rollout():
    from lit_agents.algorithms.advantages import broadcast_advantages, grpo_advantages

    r, g = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1])
    assert torch.equal(broadcast_advantages(r, g), grpo_advantages(r, g))


def test_session_aware_ranks_by_hand():
    from lit_agents.algorithms.advantages import (
        grpo_advantages,
        session_aware_advantages,
    )

    # one group: successes with K = 1, 3, 3 and failures with K = 2, 5
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])
    k = torch.tensor([1, 3, 3, 2, 5])
    g = torch.zeros(5, dtype=torch.long)
    a = grpo_advantages(r, g).double()
    # successes prefer fewer sessions: K=1 most preferred (rank 3), K=3 tied (ranks 1, 2 -> 1.5)
    # u = 2 (rank - 1) / 2 - 1: K=1 -> 1; K=3 -> -0.5. Failures prefer more: K=5 -> 1, K=2 -> -1
    u = torch.tensor([1.0, -0.5, -0.5, -1.0, 1.0], dtype=torch.float64)
    expected = a + 0.5 * a.abs() * u
    out = session_aware_advantages(r, k, g, alpha=0.5).double()
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.all(torch.sign(out) == torch.sign(a))  # the sign is always kept
    assert out[3] < a[3] < 0  # the failure that gave up early (K=2) is penalised more
    assert a[4] < out[4] < 0  # the failure that explored (K=5) less
    assert out[0] > a[0] > out[1]  # the quickest success gets the most


def test_session_aware_singletons_and_constant_groups():
    from lit_agents.algorithms.advantages import (
        grpo_advantages,
        session_aware_advantages,
    )

    r = torch.tensor([1.0, 0.0, 1.0, 1.0])  # group 0: one success, one failure; group 1: all equal
    k = torch.tensor([4, 1, 2, 7])
    g = torch.tensor([0, 0, 1, 1])
    out = session_aware_advantages(r, k, g)
    assert torch.allclose(out[:2], grpo_advantages(r, g)[:2])  # classes of one: u = 0
    assert out[2:].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError):
        session_aware_advantages(r, k, g, alpha=1.0)


def test_session_shaping_by_hand():
    from lit_agents.algorithms.advantages import SESSION_KINDS, session_shaping

    main, comp, sub = SESSION_KINDS["main"], SESSION_KINDS["compaction"], SESSION_KINDS["subagent"]
    gains = torch.tensor([0.2, 0.4, 0.9, 0.1, 0.3, 0.5, 0.5])
    kinds = torch.tensor([main, main, comp, sub, sub, main, main])
    groups = torch.tensor([0, 0, 0, 0, 0, 1, 1])
    out = session_shaping(gains, kinds, groups)
    # group 0 main: [0.2, 0.4], mean 0.3, sample std 0.14142 -> [-0.7071, 0.7071]
    # group 0 compaction: one member -> 0; group 0 subagent: [0.1, 0.3] -> [-0.7071, 0.7071]
    # group 1 main: equal gains -> 0
    s = 0.1 / (0.1414213562 + 1e-6)
    assert torch.allclose(out, torch.tensor([-s, s, 0.0, -s, s, 0.0, 0.0]), atol=1e-5)


# ---------------------------------------------------------------- RAO (hand-computed)


def test_rao_node_rewards_by_hand_and_no_compounding():
    from lit_agents.algorithms.advantages import rao_node_rewards

    # tree: 0 -> {1, 2}, 1 -> {3}; successes 1, 0, 1, 1
    success = torch.tensor([1.0, 0.0, 1.0, 1.0])
    parent = torch.tensor([-1, 0, 0, 1])
    r = rao_node_rewards(success, parent, lam=0.4)
    # root: 1 + 0.4 * mean(0, 1) = 1.2; node 1: 0 + 0.4 * 1 = 0.4; leaves: own success
    assert torch.allclose(r, torch.tensor([1.2, 0.4, 1.0, 1.0]))
    # the root's bonus uses node 1's own success (0), not its reward (0.4): no compounding
    assert rao_node_rewards(success, parent, lam=0.4, propagate_root=True).tolist() == [1.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError):
        rao_node_rewards(success, torch.tensor([-1, 1, 0, 1]))  # a node cannot be its own parent


def test_loo_baseline_by_hand():
    from lit_agents.algorithms.advantages import loo_baseline

    roots = torch.tensor([1.2, 0.0, 1.0, 0.5])
    groups = torch.tensor([0, 0, 0, 1])
    # group 0: (2.2 - R_i) / 2 -> [0.5, 1.1, 0.6]; group of one: its own reward
    assert torch.allclose(loo_baseline(roots, groups), torch.tensor([0.5, 1.1, 0.6, 0.5]))


def test_depth_weights_by_hand():
    from lit_agents.algorithms.advantages import depth_weights

    depth = torch.tensor([0, 1, 1, 2])
    rows = torch.tensor([2, 1, 1, 1])
    # N = [1, 2, 1], M = [2, 2, 1]; Z = 5 / (2/1 + 2/2 + 1/1) = 1.25; w_d = Z / N_d = [1.25, 0.625, 1.25]
    w = depth_weights(depth, rows)
    assert torch.allclose(w, torch.tensor([1.25, 0.625, 0.625, 1.25]))
    assert (w * rows).sum().item() / rows.sum().item() == pytest.approx(1.0)


def test_call_gains() -> None:
    assert call_gains([0.0, 0.25, 0.25, 1.0], 3) == [0.25, 0.0, 0.75]
    assert call_gains([0.0, 0.5], 3) == [0.5, 0.0, 0.0]  # cut short: no score after the last calls
    assert call_gains([], 0) == []


def test_turn_credit_by_hand() -> None:
    # group 0: a success (gains 1/3, 1/3, 1/3) and a failure (1/3, 0, 0, 0); group 1: all alike
    gains = [[1 / 3, 1 / 3, 1 / 3], [1 / 3, 0.0, 0.0, 0.0], [0.0, 0.0]]
    out = turn_credit(gains, torch.tensor([0, 0, 1]))
    # group 0's 7 turns: mean 4/21, sample std sqrt((4*(1/3-4/21)^2 + 3*(4/21)^2) / 6)
    mean = 4 / 21
    std = math.sqrt((4 * (1 / 3 - mean) ** 2 + 3 * mean**2) / 6)
    up, down = (1 / 3 - mean) / (std + 1e-6), -mean / (std + 1e-6)
    assert out[0] == pytest.approx([up] * 3) and out[1] == pytest.approx([up, down, down, down])
    assert out[2] == [0.0, 0.0]
    assert turn_credit([], torch.tensor([])) == []


def test_error_baseline_by_hand() -> None:
    # group 0: rewards 1, 0, 0, 1 (rollouts 0, 1, 2 had a failed action; 0 recovered); group 1: 1, 0
    # (rollout 5 had one). b = mean reward of the errored rollouts (1, 0, 0, 0) = 0.25.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    errored = torch.tensor([True, True, True, False, False, True])
    adv = grpo_advantages(rewards, groups)
    after = error_baseline_advantages(rewards, groups, adv, errored)
    s0, s1 = 1 / math.sqrt(1 / 3), 1 / math.sqrt(0.5)  # 1 / sample std of each group
    expected = [s0 * 0.75, s0 * -0.25, s0 * -0.25, s0 * 0.75, s1 * 0.75, s1 * -0.25]
    torch.testing.assert_close(after, torch.tensor(expected), atol=1e-4, rtol=0)
    # the failures' later turns: half the outcome penalty here (b = 0.25 vs the group's 0.5); a
    # recovered success: credited above its outcome advantage
    assert abs(after[1]) < abs(adv[1]) and after[0] > 0
    # RLOO's scale G / (G - 1) is found the same way
    rloo = rloo_advantages(rewards, groups)
    torch.testing.assert_close(error_baseline_advantages(rewards, groups, rloo, errored)[:4],
                               torch.tensor([4 / 3 * 0.75, 4 / 3 * -0.25, 4 / 3 * -0.25, 4 / 3 * 0.75]))
    # a group of equal rewards has no scale: 0
    same = torch.tensor([0.0, 0.0])
    assert (
        error_baseline_advantages(same, torch.tensor([0, 0]), torch.zeros(2), torch.tensor([True, False])).eq(0).all()
    )
