"""RAO's recursive loop with scripted code (the mechanics, not the model): trees grow, children
share the inventory, limits hold, every waiting node of every tree is batched."""

from __future__ import annotations

import re

import pytest

from lit_agents.agents import written_call
from lit_agents.agents.recursive import RecursiveAgent
from lit_agents.envs import TextCraftSynth
from lit_agents.policy import AgentPolicy
from lit_agents.types import Call


class Scripted(RecursiveAgent):
    """Writes the code ``script(node)`` returns instead of sampling."""

    def __init__(self, script, **kw):
        super().__init__(**kw)
        self.script, self.batches = script, []

    def complete(self, policy, engine, nodes, params, generator, version):
        self.batches.append(len(nodes))
        texts = []
        for node in nodes:
            text = self.script(node)
            node.session.calls.append(written_call(policy, node.pending, node.pending_text, text, "default"))
            texts.append(text)
        return texts


@pytest.fixture(scope="module")
def policy(tiny_config):
    return AgentPolicy(tiny=tiny_config, lora_r=4)


@pytest.fixture(scope="module")
def env():
    return TextCraftSynth(difficulty="easy")


def _solve(env, task):
    return env.expert_program(task)


def test_root_delegates_to_a_child_sharing_the_inventory(policy, env):
    task = env.tasks("train")[0]

    def script(node):
        if node.depth == 0:
            return f"print(await launch_subagent({task.goal!r}))\nprint(finish())"
        return _solve(env, task)  # the child does the whole job in the shared inventory

    rollouts = Scripted(script).run(policy, env, [task], group_size=2)
    assert len(rollouts) == 2 and all(r.success for r in rollouts)
    root, child = rollouts[0].sessions
    assert (root.kind, root.depth, root.parent) == ("main", 0, None)
    assert (child.kind, child.depth, child.parent) == ("subagent", 1, 0)
    assert child.success and root.success and child.goal == task.goal
    assert child.meta["answer"].splitlines()[-1].startswith("Success")
    assert "Success" in root.calls[-1].completion_text or rollouts[0].meta["nodes"] == 2


def test_concurrent_children_and_batching_across_trees(policy, env):
    tasks = env.tasks("train")[:3]

    def script(node):
        if node.depth == 0:
            code = ("rs = await asyncio.gather(launch_subagent(GOAL), launch_subagent(GOAL))\n"
                    "print(len(rs))\nprint(finish())")
            return code.replace("GOAL", repr(node.goal))
        return "print(view_inventory())\nprint(finish())"  # a child that does nothing fails its goal

    agent = Scripted(script)
    rollouts = agent.run(policy, env, tasks)
    assert max(agent.batches) == 6  # both children of all three trees in one model call
    for r in rollouts:
        assert [s.depth for s in r.sessions] == [0, 1, 1] and not r.success
        assert [s.success for s in r.sessions] == [False, False, False]


def test_depth_and_node_limits_refuse_launches(policy, env):
    task = env.tasks("train")[0]

    def script(node):
        return ("try:\n    print(await launch_subagent(GOAL))\nexcept ToolError as e:\n    print('refused:', e)\n"
                "print(finish())").replace("GOAL", repr(node.goal))

    (deep,) = Scripted(script, max_depth=3).run(policy, env, [task])
    assert [s.depth for s in deep.sessions] == [0, 1, 2, 3]
    assert "depth limit 3" in deep.sessions[3].meta["answer"]
    (wide,) = Scripted(script, max_depth=10, max_nodes=2).run(policy, env, [task])
    assert len(wide.sessions) == 2 and "node limit 2" in wide.sessions[1].meta["answer"]


@pytest.mark.parametrize("launches", [20, 10**4])
def test_a_launch_flood_ends_in_a_readable_error_and_the_node_goes_on(policy, env, launches):
    """A root that gathers many launches at once: 20 reach the agent, which starts the children
    the node limit allows and refuses the rest; of 10^4 the REPL refuses those past its bound on
    waiting calls (``gather`` raises at whichever refusal settles first). Either way the episode
    returns within the wall limit with the error in the root's next observation, and the root's
    REPL answers again."""
    import time

    task = env.tasks("train")[0]
    flood = ("import asyncio\nasync def go():\n    await asyncio.gather(*[launch_subagent(GOAL) for _ in range(N)])\n"
             "asyncio.run(go())").replace("N", str(launches)).replace("GOAL", repr(task.goal))

    def script(node):
        if node.depth:
            return "print(finish())"
        return flood if node.steps == 0 else "print(6*7)\nprint(finish())"

    started = time.monotonic()
    (rollout,) = Scripted(script, max_nodes=4, repl_wall_timeout_s=5.0).run(policy, env, [task])
    assert time.monotonic() - started < 30.0
    root = rollout.sessions[0]
    seen = root.calls[1].prompt_text  # what the flood's execution returned
    assert "ToolError" in seen and ("node limit 4" in seen or "max_pending_calls" in seen), seen
    assert len(rollout.sessions) <= 4
    if launches == 20:
        assert len(rollout.sessions) == 4 and "node limit 4" in seen
    assert "42" in root.meta["answer"]


def test_linear_baseline_has_no_launch_and_steps_are_limited(policy, env):
    task = env.tasks("train")[0]
    agent = Scripted(lambda node: "print(launch_subagent)", recursive=False, max_steps=3)
    (rollout,) = agent.run(policy, env, [task])
    (root,) = rollout.sessions
    assert len(root.calls) == 3 and not rollout.success and rollout.meta["reason"] == "max_steps"
    assert "NameError" in root.calls[1].prompt_text


def test_live_sampling_runs_end_to_end(policy, env):
    agent = RecursiveAgent(max_new_tokens=16, max_steps=2, repl_timeout_s=5.0)
    rollouts = agent.run(policy, env, env.tasks("train")[:2], group_size=2, seed=0)
    assert len(rollouts) == 4 and all(len(r.sessions[0].calls) <= 2 for r in rollouts)


def test_context_window_ends_a_node_before_it_overflows(policy, env):
    """A node whose next turn (context so far + observation + max_new_tokens) would not fit
    its window ends unfinished, reason ``context``; nothing it saw or wrote passes the window."""
    task = env.tasks("train")[0]
    agent = RecursiveAgent(max_new_tokens=16, max_steps=25, repl_timeout_s=5.0)
    first = len(policy.chat.start(agent.system_text(env), env.intro(env.reset(task)[0])))
    agent.max_context_tokens = first + 16 + 40  # one turn and a short observation
    (rollout,) = agent.run(policy, env, [task], seed=0)
    (root,) = rollout.sessions
    used = sum(len(c.prompt_ids) + len(c.completion_ids) for c in root.calls)
    assert rollout.meta["reason"] == "context" and not rollout.success and 1 <= len(root.calls) < 25
    assert used <= agent.max_context_tokens and root.meta["answer"].startswith("stopped: context window")
    agent.max_context_tokens = first + 15  # not even the first turn fits
    (rollout,) = agent.run(policy, env, [task], seed=0)
    assert rollout.sessions[0].calls == [] and rollout.meta["reason"] == "context"
    # turns shorter than the window's 16-token steps are whole turns where the window is wide
    for window in (None, first + 1000):
        short = RecursiveAgent(max_new_tokens=7, max_steps=2, repl_timeout_s=5.0, max_context_tokens=window)
        (rollout,) = short.run(policy, env, [task], seed=0)
        assert len(rollout.sessions[0].calls) == 2 and rollout.meta["reason"] == "max_steps"
        assert all(len(c.completion_ids) <= 7 for c in rollout.sessions[0].calls)


def test_rao_policy_node_advantages_by_hand(policy):
    from lit_agents.modules import RAOPolicy
    from lit_agents.types import Rollout, Session

    def node(sid, parent, depth, ok):
        call = Call([1, 2], [3, 4], [-0.1, -0.1])
        return Session(sid, "main" if parent is None else "subagent", parent, depth, [call], success=ok)

    # tree A: root ok, children ok / failed; tree B: a lone failed root (same group)
    a = Rollout("t", 0, [node(0, None, 0, True), node(1, 0, 1, True), node(2, 0, 1, False)], 1.0, True)
    b = Rollout("t", 0, [node(0, None, 0, False)], 0.0, False)
    advs = RAOPolicy(policy, lam=0.4, depth_weighting=False).node_advantages([a, b])
    # R: root A = 1 + 0.4 * 0.5 = 1.2, children 1 / 0, root B 0; baselines: A -> 0 (B's root), B -> 1.2
    assert advs[0] == pytest.approx([1.2, 1.0, 0.0]) and advs[1] == pytest.approx([-1.2])
    weighted = RAOPolicy(policy, lam=0.4).node_advantages([a, b])
    # N = [2, 2] nodes at depths 0, 1; M = [2, 2] rows -> Z = 4 / 2 = 2, w = [1, 1]
    assert weighted == advs
    rows = RAOPolicy(policy).rollouts_to_rows([a, b])
    assert len(rows) == 4
    # drop_zero_signal leaves out the failed child of A, whose advantage is exactly 0
    kept = RAOPolicy(policy, lam=0.4, depth_weighting=False, drop_zero_signal=True).rollouts_to_rows([a, b])
    assert len(kept) == 3 and all(any(x != 0 for x in row.advantages) for row in kept)


def _credit_trees():
    """Group 0: A (root ok; children ok, failed), B (root failed; child ok), C (a lone failed
    root); group 1: D (root ok; child failed), alone in its group."""
    from lit_agents.types import Rollout, Session

    def node(sid, parent, depth, ok):
        call = Call([1, 2], [3, 4], [-0.1, -0.1])
        return Session(sid, "main" if parent is None else "subagent", parent, depth, [call], success=ok)

    return [Rollout("t", 0, [node(0, None, 0, True), node(1, 0, 1, True), node(2, 0, 1, False)], 1.0, True),
            Rollout("t", 0, [node(0, None, 0, False), node(1, 0, 1, True)], 0.0, False),
            Rollout("t", 0, [node(0, None, 0, False)], 0.0, False),
            Rollout("u", 1, [node(0, None, 0, True), node(1, 0, 1, False)], 1.0, True)]


def test_rao_depth_baseline_compares_subagents_with_subagents(policy):
    """``baseline="depth"``: roots keep the leave-one-out root baseline; a subagent is compared
    with the group's other subagents at its depth; a node alone at its depth gets 0."""
    from lit_agents.modules import RAOPolicy

    trees = _credit_trees()
    # R: A 1.2 / 1 / 0, B 0.4 / 1, C 0, D 1.0 / 0; root baselines (leave-one-out): A 0.2, B 0.6, C 0.8
    by_root = RAOPolicy(policy, lam=0.4, depth_weighting=False).node_advantages(trees)
    assert by_root[0] == pytest.approx([1.0, 0.8, -0.2]) and by_root[1] == pytest.approx([-0.2, 0.4])
    by_depth = RAOPolicy(policy, lam=0.4, depth_weighting=False, baseline="depth").node_advantages(trees)
    # depth-1 pool of group 0: A1 = 1, A2 = 0, B1 = 1 -> baselines 0.5, 1.0, 0.5
    assert by_depth[0] == pytest.approx([1.0, 0.5, -1.0]) and by_depth[1] == pytest.approx([-0.2, 0.5])
    assert by_depth[2] == by_root[2] == pytest.approx([-0.8]) and by_depth[3] == pytest.approx([0.0, 0.0])
    with pytest.raises(ValueError, match="baseline"):
        RAOPolicy(policy, baseline="tree")


def test_rao_credit_probe_reads_saved_rollouts(tmp_path, capsys, load_research):
    """`research/rao_credit.py` on a run folder: per depth, success and the credit under both
    baselines, the run's lam read from hparams.yaml; one file per epoch (group ids restart)."""
    import json

    rao_credit = load_research("rao_credit")
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "hparams.yaml").write_text("lam: 0.4\npropagate_root: false\n")
    lines = "\n".join(json.dumps(t.to_dict()) for t in _credit_trees()[:3])  # group 0
    for epoch in (0, 1):  # the same trees twice: the shares are those of one epoch
        (tmp_path / "rollouts" / f"train-epoch{epoch:04d}-rank0.jsonl").write_text(lines + "\n")
    out = rao_credit.main([str(tmp_path)])
    sub_root, sub_depth = out["root"][1], out["depth"][1]
    assert sub_root["nodes"] == sub_depth["nodes"] == 6 and sub_root["success"] == pytest.approx(200 / 3)
    # depth 1 under "root": A1 0.8, A2 -0.2, B1 0.4; under "depth": 0.5, -1, 0.5
    assert sub_root["mean_adv"] == pytest.approx(1 / 3) and sub_depth["mean_adv"] == pytest.approx(0.0)
    assert out["root"][0] == out["depth"][0] and "baseline=depth" in capsys.readouterr().out
    (tmp_path / "hparams.yaml").write_text("lam: 0.0\n")  # R: A 1 / 1 / 0, B 0 / 1, C 0 -> 1, 0, 0.5
    assert rao_credit.main([str(tmp_path)])["root"][1]["mean_adv"] == pytest.approx(0.5)


def test_rao_asks_probe_scores_requests_against_the_recipe(tmp_path, capsys, load_research):
    """`research/rao_asks.py`: a request is over / exact / under what the node's recipe needs
    (ceil((goal - have) / output) x the ingredient's amount); saved advantages are averaged by kind;
    `check_amounts` scores every amount, and trees split by whether all of theirs are right."""
    import json

    from lit_agents.types import Rollout, Session

    rao_asks = load_research("rao_asks")
    recipe = "Recipe: 1 ranusu, 2 vifuro -> 2 lakude. You have 0 lakude."
    # craft 3 lakude -> 2 crafts: 2 ranusu and 4 vifuro are needed
    assert rao_asks.request_kinds(recipe, 'launch_subagent("craft 2 ranusu"), launch_subagent("craft 8 vifuro")',
                                  "craft 3 lakude") == ["exact", "over"]
    assert rao_asks.request_kinds(recipe, 'launch_subagent("craft 1 ranusu")', "craft 2 lakude") == ["exact"]
    assert rao_asks.request_kinds(recipe.replace("have 0", "have 2"), 'launch_subagent("craft 1 ranusu")',
                                  "craft 4 lakude") == ["exact"]
    assert rao_asks.request_kinds(recipe, 'launch_subagent("craft 0 vifuro")', "craft 1 lakude") == ["under"]
    assert rao_asks.request_kinds("Inventory: 2 dulo", 'launch_subagent("craft 9 x")', "craft 1 lakude") == []
    # a recipe the goal does not name (the node looked the wrong item up) is not scored
    assert rao_asks.request_kinds(recipe, 'launch_subagent("craft 2 ranusu")', "craft 2 dusome") == []
    # two targets: the need of a shared ingredient sums over both recipes read (2 + 3 vifuro)
    both = recipe + "\nRecipe: 3 vifuro -> 1 dusome. You have 0 dusome."
    assert rao_asks.request_kinds(both, 'launch_subagent("craft 5 vifuro"), launch_subagent("craft 1 ranusu")',
                                  "craft 1 lakude, 1 dusome") == ["exact", "exact"]

    def node(sid, completion, advantage):
        call = Call([1], [2], [-0.1], prompt_text=recipe, completion_text=completion)
        return Session(sid, "main", None, 0, [call], goal="craft 2 lakude", advantage=advantage)

    trees = [Rollout("t", 0, [node(0, 'launch_subagent("craft 4 ranusu"), launch_subagent("craft 2 vifuro")', -0.5),
                              node(1, 'launch_subagent("craft 1 ranusu")', 0.25)], 0.0, False)]
    file = tmp_path / "rollouts.jsonl"
    file.write_text("\n".join(json.dumps(t.to_dict()) for t in trees) + "\n")
    (row,) = rao_asks.main([str(file)])
    assert row["requests"] == 3 and row["over"] == pytest.approx(100 / 3) and row["exact"] == pytest.approx(200 / 3)
    assert row["adv_over"] == pytest.approx(-0.5) and row["adv_exact"] == pytest.approx(0.25)
    assert "over 33.3%" in capsys.readouterr().out
    # by the env's own check: 2 of the 3 amounts right, and this unsolved tree holds the wrong one;
    # a solved tree whose amounts are all right counts on the other side
    assert row["amounts"] == 3 and row["amounts_right"] == pytest.approx(200 / 3)
    assert (row["trees_all_right"], row["trees_some_wrong"], row["solved_some_wrong"]) == (0, 1, 0.0)
    solved = node(0, 'launch_subagent("craft 1 ranusu"), launch_subagent("craft 2 vifuro")', 0.0)
    solved.success = True
    both = rao_asks.tree_amounts([*trees, Rollout("u", 0, [solved], 1.0, True)])
    assert (both["trees_all_right"], both["solved_all_right"], both["trees_some_wrong"]) == (1, 100.0, 1)
    assert both["amounts_right"] == pytest.approx(80.0)


def test_rao_margins_probe_reads_the_gap_at_each_amount(policy, load_research):
    """`research/rao_margins.py`: at each checked amount's first token, the gap between the
    model's top token and the runner-up, and whether the top token is the written one (a model that
    puts 5 on "2" and 4 on "3": a written 2, right, is kept at a 1-nat gap; a written 3 is wrong
    and changed)."""
    from types import SimpleNamespace

    import torch

    from lit_agents.types import Rollout, Session

    rao_margins = load_research("rao_margins")
    tok = policy.tokenizer
    two, three = tok.convert_tokens_to_ids("2"), tok.convert_tokens_to_ids("3")

    def model(input_ids):
        logits = torch.zeros(*input_ids.shape, len(tok))
        logits[..., two], logits[..., three] = 5.0, 4.0
        return SimpleNamespace(logits=logits)

    prompt = "Recipe: 1 ranusu, 2 vifuro -> 1 lakude. You have 0 lakude."  # craft 1 lakude: 2 vifuro

    def tree(count):
        completion = f'print(await launch_subagent("craft {count} vifuro"))'
        call = Call(tok.encode(prompt), tok.encode(completion), [0.0] * len(tok.encode(completion)),
                    prompt_text=prompt, completion_text=completion)
        return Rollout("t", 0, [Session(0, "main", None, 0, [call], goal="craft 1 lakude")], 0.0, False)

    right, wrong = rao_margins.amount_margins(SimpleNamespace(tokenizer=tok, model=model), [tree(2), tree(3)])
    assert right.gap == pytest.approx(1.0) and right.right and right.kept and right.ask
    assert wrong.gap == pytest.approx(1.0) and not wrong.right and not wrong.kept
    s = rao_margins.summary([right, wrong])
    assert (s["amounts"], s["gap<1"], s["gap<2"], s["changed_right"], s["changed_wrong"]) == (2, 0.0, 100.0, 0.0, 100.0)


def test_rao_update_probe_reads_the_request_counts_an_update_moves(tmp_path, tiny_config, load_research):
    """`research/rao_update_probe.py`: the probe sits on the first digit of each scored request
    (here 4 where the recipe needs 2), an update that rewards the over-asking node makes the larger
    count likelier and its first-order push on log p(exact) is negative, and a variant that leaves
    the update no advantage changes nothing."""
    from lit_agents.types import Rollout, Session

    probe = load_research("rao_update_probe")  # it imports its sibling rao_asks
    model = tmp_path / "model"
    start = AgentPolicy(model="tiny", tiny=tiny_config, finetune="full")
    start.save_pretrained(model)
    tok = start.tokenizer
    prompt = "Recipe: 1 ranusu, 2 vifuro -> 1 lakude. You have 0 lakude."
    completion = 'print(await launch_subagent("craft 4 vifuro"))'

    def node(sid, advantage):
        call = Call(tok.encode(prompt), tok.encode(completion), [0.0] * len(tok.encode(completion)),
                    prompt_text=prompt, completion_text=completion)
        return Session(sid, "main", None, 0, [call], goal="craft 1 lakude", advantage=advantage)

    trees = [Rollout("t", 0, [node(0, 1.0)], 1.0, True), Rollout("t", 0, [node(0, 1.0)], 1.0, True)]
    rows, probes = probe.training_rows(trees, tok)
    assert len(rows) == 2 and len(probes) == 2 and probes[0].need == 2
    assert tok.decode([rows[0].input_ids[probes[0].position]]) == "4"
    assert rows[0].meta["kinds"][probes[0].position] == "over"
    before = probe.measure(start, rows, probes)
    push = probe.first_order(start, rows, probes)
    assert push["count:over:+"] < 0 and set(push) == {"count:over:+", "other:root:+"}
    after = probe.measure(probe.update(str(model), rows, "full", 1e-2, 1, 0.0, "k3"), rows, probes)
    assert after["over"] > before["over"] + 0.02 and after["exact"] < before["exact"]
    unchanged = probe.measure(probe.update(str(model), rows, "neg", 1e-2, 1, 0.0, "k3"), rows, probes)
    assert unchanged == pytest.approx(before, abs=1e-6)


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_expert_trees_delegate_and_deepen_with_difficulty(policy, difficulty):
    """The recursive expert's trees (code run in the sandboxes) solve their tasks, every child
    meets its goal, and harder tasks grow deeper trees; the linear expert uses one node."""
    env = TextCraftSynth(difficulty=difficulty)
    deep = RecursiveAgent(max_nodes=128, max_depth=12)
    flat = RecursiveAgent(recursive=False)
    depths = []
    for task in env.tasks("train")[:3]:
        tree = deep.expert_rollout(policy, env, task)
        assert tree.success and all(s.success for s in tree.sessions)
        assert all(len(s.calls) == 1 for s in tree.sessions)  # one code block per node
        if tree.meta["nodes"] > 1:
            assert "launch_subagent" in tree.sessions[0].calls[0].completion_text
        depths.append(tree.meta["depth"])
        line = flat.expert_rollout(policy, env, task)
        assert line.success and line.meta["nodes"] == 1
    assert max(depths) >= {"easy": 1, "medium": 3, "hard": 6}[difficulty]


def test_look_first_experts_and_a_window_too_small_for_the_linear_agent(policy):
    """Experts that read recipes before using them: a recursive node looks its targets up, then
    delegates and crafts (two turns); the linear agent looks the tree up level by level, then
    crafts. In a 384-token window the linear agent cannot hold a hard task; every node of the
    recursive tree can."""
    env = TextCraftSynth(difficulty="hard")
    deep = RecursiveAgent(look_first=True, max_nodes=128, max_depth=12, max_new_tokens=256,
                          max_context_tokens=384, system_prompt="")
    flat = RecursiveAgent(look_first=True, recursive=False, max_new_tokens=256, system_prompt="")
    for task in env.tasks("train")[:2]:
        tree = deep.expert_rollout(policy, env, task)
        assert tree.success and all(s.success for s in tree.sessions)
        assert all(len(s.calls) == 2 for s in tree.sessions)
        assert "get_info" in tree.sessions[0].calls[0].completion_text
        assert "get_info" not in tree.sessions[0].calls[1].completion_text
        line = flat.expert_rollout(policy, env, task)  # unlimited window: solved
        levels = len(env._levels(env.reset(task)[0]))
        assert line.success and len(line.sessions[0].calls) == levels + 1
        flat.max_context_tokens = 384
        short = flat.expert_rollout(policy, env, task)
        flat.max_context_tokens = None
        assert not short.success and short.meta["reason"] == "context"


def test_recursive_demonstrations_give_rows_for_every_node(policy, tmp_path, tiny_config):
    from lightning.pytorch import Trainer

    from lit_agents.data import DemonstrationDataModule
    from lit_agents.modules import System1SFT

    env = TextCraftSynth(difficulty="easy")
    data = DemonstrationDataModule(env, RecursiveAgent(max_new_tokens=64), demos=3, val_tasks=0)
    module = System1SFT(AgentPolicy(tiny=tiny_config, lora_r=4), lr=1e-3)
    Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path).fit(module, datamodule=data)
    assert {r.meta.get("kind") for r in data.rows} == {"main", "subagent"}


def test_tree_metrics_by_difficulty_concurrency_and_wall_clock(policy):
    from lit_agents.callbacks import session_stats
    from lit_agents.callbacks.session_metrics import merge_stats

    env = TextCraftSynth(min_depth=2, max_depth=5)
    tasks = env.tasks("train")[:6]
    agent = RecursiveAgent(max_nodes=64, max_depth=8)
    trees = agent._play(policy, env, tasks, 1, greedy=True, expert=True)  # expert trees, six side by side
    stats = session_stats(trees)
    levels = sorted({t.meta["difficulty"] for t in trees})
    assert len(levels) > 1
    for level in levels:
        group = [t for t in trees if t.meta["difficulty"] == level]
        assert stats[f"tree/difficulty_{level}/depth"] == sum(t.meta["depth"] for t in group) / len(group)
        assert stats[f"tree/difficulty_{level}/success"] == 1.0
    assert max(t.meta["concurrency"] for t in trees) >= 2  # gathered siblings wait on the model together
    assert all(t.meta["seconds"] > 0 for t in trees)
    assert sum(v for k, v in stats.items() if k.startswith("tree/depth_") and k.endswith("_share")) == pytest.approx(
        1.0
    )
    merged = merge_stats([(2, {"a": 1.0, "b": 3.0}), (6, {"a": 0.0})])
    assert merged == {"a": 0.25, "b": 3.0}


def test_rao_decisions_finds_the_call_where_two_greedy_trees_part(tmp_path, capsys, load_research):
    """`research/rao_decisions.py`: for each task one evaluation solved and the other did not,
    the first differing call is a count change (larger/smaller) when only its numbers differ."""
    import json

    from lit_agents.types import Rollout, Session

    decisions = load_research("rao_decisions")
    recipe = "Recipe: 1 soke, 2 noza -> 1 dena. You have 0 dena."

    def tree(task, success, *completions):
        sessions = [Session(i, "main" if i == 0 else "subagent", None if i == 0 else 0, min(i, 1),
                            [Call([1], [2], [0.0], prompt_text=recipe, completion_text=c)])
                    for i, c in enumerate(completions)]
        return Rollout(task, 0, sessions, float(success), success)

    ask = 'launch_subagent("craft {} noza"); craft("dena", 1)'
    start = [tree("a", True, "look", ask.format(2)), tree("b", False, ask.format(1)),
             tree("c", True, ask.format(2)), tree("d", True, ask.format(2))]
    after = [tree("a", False, "look", ask.format(4)), tree("b", True, ask.format(2)),
             tree("c", True, ask.format(4)), tree("d", False, ask.format(2).replace("noza", "soke"))]
    for name, trees in (("start", start), ("after", after)):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(t.to_dict()) for t in trees) + "\n")
    out = decisions.main([str(tmp_path / "start.jsonl"), str(tmp_path / "after.jsonl")])
    # a: lost at its second call (4 noza for 2); b: gained by asking more; c: unchanged outcome;
    # d: lost to another ingredient
    assert out["lost"] == {"count larger": 1, "other": 1} and out["gained"] == {"count larger": 1}
    assert "lost 2: count larger 1, other 1" in capsys.readouterr().out
    decisions.main([str(tmp_path / "start.jsonl"), str(tmp_path / "after.jsonl"), "--show"])
    shown = capsys.readouterr().out
    assert "lost a, call 1:" in shown and "craft 4 noza" in shown and "gained b, call 0:" in shown
    assert " c, call" not in shown  # an unchanged outcome is not shown
    (tmp_path / "after.jsonl").write_text(json.dumps(after[0].to_dict()) + "\n")
    with pytest.raises(SystemExit, match="different tasks"):
        decisions.main([str(tmp_path / "start.jsonl"), str(tmp_path / "after.jsonl")])


def test_amount_check_passes_the_expert_and_flags_wrong_amounts(policy):
    """`check_amounts` reads a node's transcript: every amount the look-first expert writes is
    right; a request for more than the recipe needs, or a craft of more runs than the goal's, is
    wrong; a craft rounded up within the same runs is right."""
    from lit_agents.envs.textcraft_synth import check_amounts
    from lit_agents.modules.rao import node_calls

    env = TextCraftSynth(difficulty="medium")
    agent = RecursiveAgent(look_first=True, max_nodes=128, max_depth=12, max_new_tokens=256, system_prompt="")
    checked = 0
    for task in env.tasks("train")[:2]:
        for session in agent.expert_rollout(policy, env, task).sessions:
            for call, _, prompt in node_calls(session):
                checks = check_amounts(prompt, call.completion_text, session.goal)
                assert all(right for *_, right in checks), (session.goal, call.completion_text)
                checked += len(checks)
    assert checked >= 10
    read = "Goal: craft 3 kavoru.\nRecipe: 1 temila, 2 rosani -> 2 kavoru. You have 0 kavoru."
    code = ('await asyncio.gather(launch_subagent("craft 2 temila"), launch_subagent("craft 5 rosani"))\n'
            'print(craft("kavoru", 4))\nprint(craft("kavoru", 5))\nprint(craft("tuvo", 9))')
    checks = check_amounts(read, code, "craft 3 kavoru")
    assert [(code[a:b], right) for a, b, right in checks] == [("2", True), ("5", False), ("4", True), ("5", False)]
    assert check_amounts("Goal: craft 3 kavoru.", code, "craft 3 kavoru") == [checks[2][:2] + (False,),
                                                                              checks[3][:2] + (False,)]


def test_rao_amount_credit_replaces_the_node_advantage_on_amount_tokens(policy):
    """``amount_credit``: the tokens of each checked amount get ``amount_credit x (1[right] -
    share right)`` in place of their node's advantage; every other token keeps the node's."""
    from lit_agents.envs.textcraft_synth import check_amounts
    from lit_agents.modules import RAOPolicy

    env = TextCraftSynth(difficulty="easy")
    task = next(t for t in env.tasks("train") if env.world.tier[next(iter(env.parse_goal(t.goal)))] >= 2)

    def script(node):  # the expert, except that the root asks for one more of each ingredient
        code = env.expert_turn(node.state, node.steps, True)
        if node.depth == 0 and node.steps == 1:
            code = re.sub(r'craft (\d+)', lambda m: f"craft {int(m[1]) + 1}", code)
        return code

    trees = Scripted(script, look_first=True, max_nodes=32, max_depth=8).run(policy, env, [task], group_size=2)
    plain = RAOPolicy(policy, lam=0.4, depth_weighting=False).rollouts_to_rows(trees)
    module = RAOPolicy(policy, lam=0.4, depth_weighting=False, amount_credit=2.0,
                       amount_check="lit_agents.envs.textcraft_synth.check_amounts")
    rows = module.rollouts_to_rows(trees)
    share = module._amounts_right
    assert 0 < share < 1
    changed = {False: [], True: []}  # (depth, token text) of the tokens whose advantage changed
    for before, after in zip(plain, rows):
        session = trees[after.meta["rollout"]].sessions[after.meta["session"]]
        for k, (a, b) in enumerate(zip(before.advantages, after.advantages)):
            if a != b:
                right = b > 0
                assert b == pytest.approx(2.0 * (float(right) - share))
                changed[right].append((session.depth, policy.tokenizer.decode([after.input_ids[k]]).strip()))
    asks = trees[0].sessions[0].calls[1].completion_text.count("launch_subagent")
    assert asks >= 1 and len(changed[False]) >= 2 * asks  # every wrong request, in both trees
    assert changed[True]
    assert all(depth == 0 for depth, _ in changed[False])  # only the root's requests are wrong
    assert all(text.isdigit() for _, text in changed[False] + changed[True])
    with pytest.raises(ValueError, match="amount_check"):
        RAOPolicy(policy, amount_credit=1.0)
    assert check_amounts is module.amount_check
