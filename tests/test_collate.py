"""Rows from sessions and demonstrations, padding, truncation and token-budget batches."""

from __future__ import annotations

import random

import pytest
import torch

from lit_agents.algorithms.collate import (
    Batch,
    Row,
    batch_positions,
    batches_by_tokens,
    collate_packed,
    collate_rows,
    demo_row,
    group_steps,
    pack_rows,
    packs_by_tokens,
    record_advantages,
    row_orders,
    segments_row,
    sequence_mean_rows,
    session_rows,
)
from lit_agents.types import Call, Rollout, Session


def _two_call_session() -> Session:
    calls = [
        Call(prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.1, -0.2], role="executor"),
        Call(
            prompt_ids=[6], completion_ids=[7, 8, 9], logprobs=[-0.3, -0.4, -0.5], role="executor"
        ),
    ]
    return Session(session_id=0, kind="main", calls=calls)


def _rollout() -> Rollout:
    empty = Session(
        session_id=1, kind="subagent", parent=0, depth=1,
        calls=[Call(prompt_ids=[10, 11], completion_ids=[], logprobs=[])],
    )
    compaction = Session(
        session_id=2, kind="compaction", parent=0,
        calls=[Call(prompt_ids=[12], completion_ids=[13], logprobs=[-0.6])],
    )
    return Rollout(task_id="t0", group_id=3, sessions=[_two_call_session(), empty, compaction])


def test_two_call_session_layout_and_skip_empty() -> None:
    rows = session_rows([_rollout()], [[0.5, 9.0, -1.0]])
    assert len(rows) == 2  # the subagent session generated nothing
    row = rows[0]
    assert row.input_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert row.action_mask == [False, False, False, True, True, False, True, True, True]
    assert row.old_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3, -0.4, -0.5]
    assert row.advantages == [0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5]
    assert row.role == "executor"
    assert row.meta == {
        "session_id": 0, "kind": "main", "depth": 0, "truncated": False, "tokens_dropped": 0,
        "rollout": 0, "session": 0, "advantage": 0.5, "group_id": 3, "task_id": "t0",
    }
    second = rows[1]
    assert second.input_ids == [12, 13] and second.advantages == [0.0, -1.0]
    assert second.meta["session_id"] == 2 and second.meta["kind"] == "compaction"


def test_rollout_indices_and_length_checks() -> None:
    rows = session_rows([_rollout(), _rollout()], [[1.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    assert [r.meta["rollout"] for r in rows] == [0, 0, 1, 1]
    assert rows[2].advantages[3] == 2.0
    with pytest.raises(ValueError, match="advantages"):
        session_rows([_rollout()], [[1.0]])
    with pytest.raises(ValueError, match="advantage lists"):
        session_rows([_rollout()], [])


def test_truncation_keeps_prefix() -> None:
    rollout = Rollout(task_id="t", group_id=0, sessions=[_two_call_session()])
    (row,) = session_rows([rollout], [[0.5]], max_tokens=5)
    assert row.input_ids == [1, 2, 3, 4, 5]
    assert row.action_mask == [False, False, False, True, True]
    assert row.old_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2]
    assert row.meta["truncated"] is True and row.meta["tokens_dropped"] == 4
    # Cut inside the first prompt: nothing generated is left, so no row.
    assert session_rows([rollout], [[0.5]], max_tokens=3) == []
    assert sum(r.meta["truncated"] for r in session_rows([rollout], [[0.5]], max_tokens=9)) == 0


def test_generated_first_token_is_masked() -> None:
    session = Session(calls=[Call(prompt_ids=[], completion_ids=[4, 5], logprobs=[-0.1, -0.2])])
    (row,) = session_rows([Rollout(task_id="t", group_id=0, sessions=[session])], [[1.0]])
    assert row.action_mask == [False, True]
    assert row.old_logprobs == [0.0, -0.2] and row.advantages == [0.0, 1.0]


def test_demo_rows() -> None:
    row = demo_row([1, 2], [3, 4], role="planner")
    assert row.input_ids == [1, 2, 3, 4]
    assert row.action_mask == [False, False, True, True]
    assert row.old_logprobs == [0.0] * 4 and row.advantages == [0.0] * 4
    assert row.role == "planner"
    multi = segments_row([([1], False), ([2, 3], True), ([4], False), ([5], True)])
    assert multi.action_mask == [False, True, True, False, True]
    with pytest.raises(ValueError, match="prompt"):
        demo_row([], [3, 4])
    with pytest.raises(ValueError, match="action_mask\\[0\\]"):
        Row([1, 2], [True, True], [0.0, 0.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="length"):
        Row([1, 2], [False], [0.0, 0.0], [0.0, 0.0])


def test_batch_forms_are_explicit_and_survive_the_device_transfer() -> None:
    from lightning.fabric.utilities.apply_func import move_data_to_device

    tensors = collate_rows(session_rows([_rollout()], [[0.5, 0.0, -1.0]]), pad_id=99, with_meta=True)
    batch = Batch(tensors, step_tokens=7, accumulate=2)
    assert batch.has_rows and len(batch) == len(tensors["input_ids"]) > 0
    assert not Batch.empty().has_rows and len(Batch.empty()) == 0 and Batch.empty().kind == "empty"
    assert Batch.pad().kind == "pad" and not Batch.pad().has_rows
    with pytest.raises(ValueError, match="needs tensors"):
        Batch({})
    with pytest.raises(ValueError, match="has no tensors"):
        Batch(tensors, kind="pad")
    moved = move_data_to_device(batch, torch.device("cpu"))  # what Lightning does before training_step
    assert isinstance(moved, Batch) and moved.step_tokens == 7 and moved.accumulate == 2
    assert moved.tensors["meta"] == tensors["meta"] and torch.equal(moved.tensors["input_ids"], tensors["input_ids"])


def test_collate_pads_right() -> None:
    rows = session_rows([_rollout()], [[0.5, 0.0, -1.0]])
    batch = collate_rows(rows, pad_id=99)
    assert batch["input_ids"].tolist() == [
        [1, 2, 3, 4, 5, 6, 7, 8, 9],
        [12, 13, 99, 99, 99, 99, 99, 99, 99],
    ]
    assert batch["attention_mask"].tolist() == [[1] * 9, [1, 1] + [0] * 7]
    assert batch["action_mask"].tolist() == [
        [False, False, False, True, True, False, True, True, True],
        [False, True] + [False] * 7,
    ]
    torch.testing.assert_close(
        batch["old_logprobs"],
        torch.tensor([[0, 0, 0, -0.1, -0.2, 0, -0.3, -0.4, -0.5], [0, -0.6] + [0] * 7]),
    )
    torch.testing.assert_close(
        batch["advantages"],
        torch.tensor([[0, 0, 0, 0.5, 0.5, 0, 0.5, 0.5, 0.5], [0, -1.0] + [0] * 7]),
    )
    assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.long
    assert batch["action_mask"].dtype == torch.bool
    assert batch["old_logprobs"].dtype == torch.float32
    with pytest.raises(ValueError):
        collate_rows([], pad_id=0)
    bad = demo_row([1], [2])
    bad.action_mask[0] = True
    with pytest.raises(ValueError, match="action_mask\\[0\\]"):
        collate_rows([bad], pad_id=0)


def _row(n: int) -> Row:
    return demo_row([1] * (n - 1), [2])


def test_batches_by_tokens_hand_example() -> None:
    rows = [_row(n) for n in (5, 3, 8, 2, 2, 7, 20)]
    batches = batches_by_tokens(rows, max_tokens_per_batch=16)
    # longest first: [20] alone (over budget); [8, 7] = 2*8; [5, 3, 2] = 3*5; [2].
    assert [[r.num_tokens for r in b] for b in batches] == [[20], [8, 7], [5, 3, 2], [2]]
    assert batches[2][2] is rows[3] and batches[3][0] is rows[4]  # ties keep input order
    assert batches == batches_by_tokens(rows, max_tokens_per_batch=16)


def test_row_orders_by_length_and_by_group() -> None:
    rows = []
    for group, n in ((0, 10), (0, 4), (1, 12), (0, 9), (None, 6), (1, 3)):
        row = _row(n)
        if group is not None:
            row.meta["group_id"] = group
        rows.append(row)
    by_length, by_group = row_orders(rows)
    assert [r.num_tokens for r in by_length] == [12, 10, 9, 6, 4, 3]
    # groups in order of their longest row, each longest first; the lone row is a group of one
    assert [r.num_tokens for r in by_group] == [12, 3, 10, 9, 4, 6]
    assert batches_by_tokens(rows, 30) == batches_by_tokens(rows, 30, share_prefix=False)
    assert [[r.num_tokens for r in b] for b in batches_by_tokens(rows, 30)] == [[12, 10], [9, 6, 4], [3]]


def _task_rows(prompt: list[int], own: list[int], group: int) -> list[Row]:
    rows = []
    for k, n in enumerate(own):
        row = segments_row([(prompt, False), ([5 + k] * n, True)])
        row.meta["group_id"] = group
        rows.append(row)
    return rows


def test_batches_by_tokens_keeps_tasks_together_where_their_prompt_saves_more() -> None:
    """A long shared prompt: micro-batches of whole tasks, each prompt run once, cost fewer
    positions than length order, which interleaves the tasks; short prompts under rows of very
    different lengths: length order stays. `batch_positions` is the policy's own count."""
    long_a, long_b = [7] * 60, [8] * 60
    rows = _task_rows(long_a, [10, 14, 12, 16], 0) + _task_rows(long_b, [11, 15, 13, 17], 1)
    budget = 4 * 77
    by_length = batches_by_tokens(rows, budget)
    assert [{r.meta["group_id"] for r in b} for b in by_length] == [{0, 1}, {0, 1}]
    grouped = batches_by_tokens(rows, budget, share_prefix=True)
    assert [{r.meta["group_id"] for r in b} for b in grouped] == [{1}, {0}]
    # the prefix stops before the state that predicts the first trained token (59 of 60 prompt tokens)
    assert batch_positions(grouped[0]) == 59 + 4 * 18 and batch_positions(grouped[0], share_prefix=False) == 4 * 77
    assert sum(map(batch_positions, grouped)) < sum(map(batch_positions, by_length))

    short = _task_rows([7] * 16, [2, 60, 3, 58], 0) + _task_rows([8] * 16, [59, 4, 61, 1], 1)
    assert batches_by_tokens(short, 2 * 77, share_prefix=True) == batches_by_tokens(short, 2 * 77)


def test_batches_by_tokens_budget_and_coverage() -> None:
    rng = random.Random(0)
    rows = [_row(rng.randint(2, 40)) for _ in range(200)]
    for row in rows[:150]:
        row.meta["group_id"] = rng.randrange(20)
    budget = 64
    batches = batches_by_tokens(rows, budget)
    seen = [id(r) for b in batches for r in b]
    assert sorted(seen) == sorted(id(r) for r in rows)  # every row exactly once
    for b in batches:
        assert len(b) * max(r.num_tokens for r in b) <= budget
    assert batches_by_tokens([], budget) == []
    with pytest.raises(ValueError):
        batches_by_tokens(rows, 0)


def test_pack_rows_first_fit_longest_first() -> None:
    rows = [_row(n) for n in (5, 3, 8, 2, 2, 7, 20)]
    packs = pack_rows(rows, pack_length=10)
    # 20 alone (too long); 8 + 2; 7 + 3; 5 + 2
    assert [[r.num_tokens for r in p] for p in packs] == [[20], [8, 2], [7, 3], [5, 2]]
    assert sorted(id(r) for p in packs for r in p) == sorted(id(r) for r in rows)
    batches = packs_by_tokens(rows, max_tokens_per_batch=40)  # pack length 20: 2 packs a batch
    assert [len(b) for b in batches] == [2, 1] and packs_by_tokens([], 40) == []
    with pytest.raises(ValueError):
        pack_rows(rows, 0)


def test_collate_packed_positions_restart_per_row() -> None:
    a, b, c = demo_row([1, 2], [3]), demo_row([4], [5, 6]), demo_row([7, 8, 9], [10])
    a.meta, b.meta, c.meta = {"i": 0}, {"i": 1}, {"i": 2}
    batch = collate_packed([[a, b], [c]], pad_id=0, with_meta=True)
    assert batch["input_ids"].shape == (2, 6)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0]]
    assert batch["action_mask"].tolist() == [
        [False, False, True, False, True, True],
        [False] * 3 + [True, False, False],
    ]
    assert [(m["i"], m["pack"], m["offset"]) for m in batch["meta"]] == [(0, 0, 0), (1, 0, 3), (2, 1, 0)]


def test_per_call_advantages_land_on_each_calls_completion() -> None:
    rollout = Rollout("t", group_id=3, sessions=[_two_call_session()])
    (row,) = session_rows([rollout], [[[0.5, -2.0]]])
    # tokens: prompt 1 2 3, completion 4 5 (call 0), prompt 6, completion 7 8 9 (call 1)
    assert row.advantages == [0.0, 0.0, 0.0, 0.5, 0.5, 0.0, -2.0, -2.0, -2.0]
    assert row.meta["advantage"] == pytest.approx(-0.75) and row.meta["session"] == 0
    assert rollout.sessions[0].advantage is None  # session_rows leaves its input alone
    record_advantages([rollout], [row])
    assert rollout.sessions[0].advantage == pytest.approx(-0.75)
    with pytest.raises(ValueError, match="2 calls but 3 advantages"):
        session_rows([rollout], [[[0.5, -2.0, 1.0]]])


def _grouped(sizes: list[int], group: int) -> list[Row]:
    rows = []
    for n in sizes:
        row = demo_row([1], [2] * n)
        row.meta["group_id"] = group
        rows.append(row)
    return rows


def test_group_steps_keep_groups_whole_and_balance_tokens() -> None:
    rows = [r for g, sizes in enumerate([[3, 9], [2], [7, 1, 1], [8]]) for r in _grouped(sizes, g)]
    # groups of 12, 2, 9 and 8 trained tokens (31): two steps cut where the tokens halve
    steps = group_steps(rows, 2)
    assert [[r.meta["group_id"] for r in step] for step in steps] == [[0, 0, 1], [2, 2, 2, 3]]
    assert [len(s) for s in group_steps(rows, 1)] == [len(rows)]
    assert len(group_steps(rows, 10)) == 4  # never more steps than groups, none empty
    rng = random.Random(0)
    for trial in range(300):
        sizes = [[rng.randint(1, 30) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(1, 20))]
        rows = [r for g, s in enumerate(sizes) for r in _grouped(s, g)]
        m = rng.randint(1, 6)
        steps = group_steps(rows, m, random.Random(trial))
        assert len(steps) == min(m, len(sizes)) and all(steps)
        where = {}
        for k, step in enumerate(steps):
            for row in step:
                assert where.setdefault(row.meta["group_id"], k) == k  # a group in one step
        assert sorted(id(r) for s in steps for r in s) == sorted(id(r) for r in rows)
    with pytest.raises(ValueError):
        group_steps(rows, 0)


def test_rollout_data_module_groups_tasks_only_where_the_policy_shares_prefixes() -> None:
    """`RolloutDataModule.token_batches` asks the training module's policy whether it runs shared
    prompts once (`AgentPolicy.shares_prefixes`) and batches accordingly."""
    from types import SimpleNamespace

    from lit_agents.data import RolloutDataModule
    from lit_agents.envs import TextCraft

    rows = _task_rows([7] * 60, [10, 14, 12, 16], 0) + _task_rows([8] * 60, [11, 15, 13, 17], 1)
    data = RolloutDataModule(TextCraft(), max_tokens_per_batch=4 * 77)
    for shares in (True, False):
        policy = SimpleNamespace(shares_prefixes=lambda shares=shares: shares)
        data.trainer = SimpleNamespace(lightning_module=SimpleNamespace(policy=policy))
        assert data.token_batches(rows) == batches_by_tokens(rows, 4 * 77, share_prefix=shares)
    assert [{r.meta["group_id"] for r in b} for b in data.token_batches(rows)] == [{0, 1}, {0, 1}]
    data.trainer = None
    assert data.token_batches(rows) == batches_by_tokens(rows, 4 * 77)


def test_a_module_that_steps_on_every_micro_batch_gets_batches_in_the_given_order() -> None:
    """A module that optimizes by hand (`System2ActorCritic`) steps on every micro-batch and
    normalises its actor weights over it: its batches are cut from the (shuffled) rows in order,
    each mixing lengths, not from the rows sorted by length, where a step would be all long rows
    (in Multi2's half-noisy data, the noisiest)."""
    from types import SimpleNamespace

    from lit_agents.data import DemonstrationDataModule
    from lit_agents.envs import TextCraft

    rows = [_row(n) for n in (3, 12, 4, 10)]
    assert [[r.num_tokens for r in b] for b in batches_by_tokens(rows, 30)] == [[12, 10], [4, 3]]
    assert [[r.num_tokens for r in b] for b in batches_by_tokens(rows, 30, by_length=False)] == [[3, 12], [4, 10]]
    data = DemonstrationDataModule(TextCraft(), max_tokens_per_batch=30)
    policy = SimpleNamespace(shares_prefixes=lambda: False)
    for manual in (False, True):
        module = SimpleNamespace(policy=policy, automatic_optimization=not manual)
        data.trainer = SimpleNamespace(lightning_module=module)
        assert data.token_batches(rows) == batches_by_tokens(rows, 30, by_length=not manual)


def test_sequence_mean_rows_make_the_token_mean_loss_a_mean_of_row_means() -> None:
    """PPO-clip's token mean over the reweighted rows = the mean over rows of each original row's
    own token-mean loss (every row weighs alike); over the original rows the long row dominates."""
    from lit_agents.algorithms.losses import ppo_clip_loss

    def row(n: int, adv: float) -> Row:
        return Row([1] * (n + 1), [False] + [True] * n, [-1.0] * (n + 1), [0.0] + [adv] * n)

    rows = [row(2, 1.0), row(10, -0.5), row(4, 2.0)]
    weighted = sequence_mean_rows(rows)
    mean = (2 + 10 + 4) / 3
    assert [r.advantages[1] for r in weighted] == pytest.approx([1.0 * mean / 2, -0.5 * mean / 10, 2.0 * mean / 4])
    assert rows[0].advantages == [0.0, 1.0, 1.0]  # the input rows are not modified
    torch.manual_seed(0)

    def loss(rs: list[Row], logp: torch.Tensor) -> torch.Tensor:
        t = collate_rows(rs, pad_id=0)
        return ppo_clip_loss(logp, t["old_logprobs"], t["advantages"], t["action_mask"]).loss

    logp = -1.0 + 0.5 * torch.randn(3, 11)  # ratios far enough from 1 that some tokens clip
    per_row = [loss([r], logp[i : i + 1, : r.num_tokens]) for i, r in enumerate(rows)]
    assert loss(weighted, logp).item() == pytest.approx(torch.stack(per_row).mean().item(), rel=1e-5)
    assert loss(rows, logp).item() != pytest.approx(torch.stack(per_row).mean().item(), rel=1e-2)
    empty = Row([1, 2], [False, False], [0.0, 0.0], [0.0, 0.0])
    assert sequence_mean_rows([empty]) == [empty]  # no trained token: nothing to weigh
