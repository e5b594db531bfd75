"""The learning comparison with TRL (`benchmarks/learn_vs_trl.py`) without TRL: its prompt pool."""

from __future__ import annotations

from transformers import AutoTokenizer

from lit_agents.envs import TextCraft
from lit_agents.tiny import embedded_default


def test_a_prompt_pool_is_one_fixed_draw_that_each_task_finds_again(tiny_config, load_benchmark):
    """``--pool N``: the same N prompts in every run, re-indexed so that the env serves each task its
    own prompt (a wrong index would train one task's completions against another's reward)."""
    bench = load_benchmark("learn_vs_trl")  # it imports its sibling trl_matched
    textcraft = TextCraft(**bench.QUICKSTART_ENV, max_steps=12, train_goals=4)
    agent = bench.GivenPrompt(max_new_tokens=8, temperature=1.0, system_prompt="")
    prompts, failed, mismatched = bench.final_craft_prompts(
        textcraft, agent, AutoTokenizer.from_pretrained(embedded_default(tiny_config)))
    assert len(prompts) == 4 * 16 and not failed and not mismatched

    pooled = bench.pool(prompts, 6)
    assert [p.task.task_id for p in pooled] == [p.task.task_id for p in bench.pool(prompts, 6)]
    assert len({p.task.task_id for p in pooled}) == 6
    assert [p.task.meta["index"] for p in pooled] == list(range(6))
    original = {p.task.task_id: p for p in prompts}
    env = bench.FinalCraft(textcraft, agent, pooled)
    for task in env.tasks("train"):
        prompt, text = env.reset(task)
        assert prompt.task.task_id == task.task_id
        assert prompt.ids == original[task.task_id].ids and text == original[task.task_id].text
        expert = textcraft.expert_action(prompt.state)  # the final craft solves it
        assert bench.craft_reward(textcraft, agent, prompt, expert) == 1.0
    assert len(bench.pool(prompts, 0)) == len(bench.pool(prompts, 10**6)) == len(prompts)


def test_row_batches_cut_r_rows_from_the_cheaper_order(tiny_config, load_benchmark):
    """``--rows-per-batch R`` (vs_trl_multiturn.py): our micro-batches hold R rows, as TRL's do, cut
    from the order our own batching would pick: a task's rows together where their prompt is long."""
    from lit_agents.algorithms.collate import segments_row

    matched = load_benchmark("trl_matched")
    data = matched.RowBatches(TextCraft(**matched.QUICKSTART_ENV), rows_per_batch=4)

    def task(prompt: list[int], own: list[int], group: int) -> list:
        rows = [segments_row([(prompt, False), ([5 + k] * n, True)]) for k, n in enumerate(own)]
        for row in rows:
            row.meta["group_id"] = group
        return rows

    rows = task([7] * 60, [10, 14, 12, 16], 0) + task([8] * 60, [11, 15, 13, 17], 1)
    batches = data.token_batches(rows)
    assert [len(b) for b in batches] == [4, 4]
    assert [{r.meta["group_id"] for r in b} for b in batches] == [{1}, {0}]
    short = task([7] * 16, [2, 60, 3, 58], 0) + task([8] * 16, [59, 4, 61, 1], 1)
    by_length = data.token_batches(short)
    assert [[r.num_tokens for r in b] for b in by_length] == [[77, 76, 75, 74], [20, 19, 18, 17]]
