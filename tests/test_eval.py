"""``lit-agents eval``: end-to-end on the embedded default (flat, multi-session and recursive
agents), a saved adapter or model really loaded, and the summary worked out by hand."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml
from lora_weights import set_lora_b

from lit_agents.callbacks import LoRACheckpoint
from lit_agents.cli import main as cli_main
from lit_agents.envs.base import Task
from lit_agents.pipelines import evaluate
from lit_agents.types import Call, Rollout, Session

ROOT = Path(__file__).parents[1]
CONFIGS = ROOT / "configs"
# the embedded default at a toy size (configs/debug/tiny_model.yaml)
TINY = ["-c", str(CONFIGS / "debug" / "tiny_model.yaml"), "--model.init_args.policy.init_args.model=tiny"]
SHORT = ["--data.init_args.agent.init_args.max_new_tokens=6", "--data.init_args.agent.init_args.max_steps=2"]


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _markdown_rows(path: Path) -> dict[str, list[str]]:
    """First cell -> the other cells of each body row of summary.md's table."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("| ")][1:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {row[0]: row[1:] for row in cells}


@pytest.mark.parametrize(("config", "group_by", "agent"), [
    ("quickstart_rl.yaml", "depth", "ReActAgent"),
    ("mosaic/compaction_mosaic.yaml", "reason", "MultiSessionAgent"),
    ("rao/recursive.yaml", "difficulty", "RecursiveAgent"),
    ("multi2/system1_sft.yaml", "depth", "HierarchicalAgent"),
])
def test_eval_writes_results_that_the_summary_adds_up(tmp_path, capsys, config, group_by, agent):
    out = tmp_path / "eval"
    cli_main(["eval", "-c", str(CONFIGS / config), *TINY, *SHORT, "--split", "test", "--tasks", "3",
                       "--seeds", "0,1", "--group-by", group_by, "--out", str(out)])
    for name in ("results.csv", "rollouts.jsonl", "summary.csv", "summary.md", "success.png"):
        assert (out / name).stat().st_size > 0, name
    rows = _csv(out / "results.csv")
    columns = [*evaluate.COLUMNS, *([group_by] if group_by not in evaluate.COLUMNS else [])]
    assert list(rows[0]) == columns
    assert [r["seed"] for r in rows] == ["0"] * 3 + ["1"] * 3
    cli = evaluate.build([CONFIGS / config], [*TINY, *SHORT])  # the same seeded samples as validation's
    assert type(cli.datamodule.agent).__name__ == agent
    for seed in (0, 1):
        expected = [t.task_id for t in evaluate.held_out(cli, "test", 3, seed)]
        assert [r["task_id"] for r in rows if r["seed"] == str(seed)] == expected
    assert len((out / "rollouts.jsonl").read_text().splitlines()) == 6
    assert all(int(r["sessions"]) >= 1 and int(r["turns"]) >= 1 and int(r["generated_tokens"]) >= 1 for r in rows)

    table = _markdown_rows(out / "summary.md")
    assert table["all"][0] == "6"
    groups = sorted({r[group_by] for r in rows})
    assert set(table) == {"all", *groups}
    for name in ["all", *groups]:
        mine = [r for r in rows if name == "all" or r[group_by] == name]
        n, success, _reward, generated, tokens = table[name][:5]
        assert int(n) == len(mine)
        assert success.startswith(f"{100 * sum(int(r['success']) for r in mine) / len(mine):.1f}%")
        assert generated == f"{sum(int(r['generated_tokens']) for r in mine) / len(mine):.1f}"
        assert tokens == f"{sum(int(r['total_tokens']) for r in mine) / len(mine):.1f}"
    summary = _csv(out / "summary.csv")
    assert [s["group"] for s in summary] == list(table)
    assert [s["n"] for s in summary] == [cells[0] for cells in table.values()]
    assert (out / "summary.md").read_text().strip() in capsys.readouterr().out


def _perturbed_lora(cli, seed: int = 0) -> dict[str, torch.Tensor]:
    """Give every LoRA B matrix random weights (fresh adapters are the identity)."""
    return set_lora_b(cli.model.policy, std=2.0, generator=torch.Generator().manual_seed(seed))


def _completions(path: Path) -> list[str]:
    rollouts = [Rollout.from_dict(json.loads(line)) for line in path.read_text().splitlines()]
    return [c.completion_text for r in rollouts for s in r.sessions for c in s.calls]


@pytest.mark.parametrize("terminal", [True, False])
def test_eval_shows_the_turns_bar_in_a_terminal_only(tmp_path, capsys, monkeypatch, terminal):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    evaluate.main(["-c", str(CONFIGS / "quickstart_rl.yaml"), *TINY, *SHORT, "--tasks", "2",
                   "--out", str(tmp_path / "eval")])
    assert ("turns: " in capsys.readouterr().err) == terminal


def test_a_saved_adapter_is_loaded_and_used(tmp_path):
    config, overrides = [CONFIGS / "quickstart_rl.yaml"], [*TINY, *SHORT]
    trained = evaluate.build(config, overrides)
    weights = _perturbed_lora(trained)
    checkpoint = LoRACheckpoint().save(trained.model, tmp_path / "adapters" / "last")  # <log_dir>/adapters/last

    loaded = evaluate.build(config, overrides, adapter=checkpoint)
    params = dict(loaded.model.policy.named_parameters())
    assert loaded.model.policy.active_role == "default"
    assert all(torch.equal(params[name], value) for name, value in weights.items())
    single = evaluate.build(config, overrides, adapter=checkpoint / "default")  # one peft folder
    assert all(torch.equal(dict(single.model.policy.named_parameters())[n], v) for n, v in weights.items())

    args = ["-c", str(config[0]), *overrides, "--tasks", "3"]
    baseline = evaluate.main([*args, "--out", str(tmp_path / "baseline")])
    report = evaluate.main([*args, "--adapter", str(checkpoint)])
    assert report.out == tmp_path / "eval" / "last-test"  # next to the checkpoint, in the run's folder
    assert [r["task_id"] for r in report.rows] == [r["task_id"] for r in baseline.rows]
    assert _completions(report.out / "rollouts.jsonl") != _completions(baseline.out / "rollouts.jsonl")


def test_results_are_never_overwritten_silently(tmp_path, capsys):
    """The default folder of an adapter's results is versioned (``last-test``, ``last-test-v1``);
    an ``--out`` that holds files is refused unless ``--overwrite``."""
    config, overrides = CONFIGS / "quickstart_rl.yaml", [*TINY, *SHORT]
    checkpoint = LoRACheckpoint().save(evaluate.build([config], overrides).model, tmp_path / "adapters" / "last")
    args = ["eval", "-c", str(config), *overrides, "--tasks", "2", "--adapter", str(checkpoint)]
    cli_main(args)
    first = (tmp_path / "eval" / "last-test" / "results.csv").read_bytes()
    (tmp_path / "eval" / "last-test" / "notes.txt").write_text("mine")
    cli_main(args)
    assert "written to " + str(tmp_path / "eval" / "last-test-v1") in capsys.readouterr().out
    assert (tmp_path / "eval" / "last-test" / "results.csv").read_bytes() == first
    assert (tmp_path / "eval" / "last-test-v1" / "results.csv").exists()

    with pytest.raises(SystemExit):
        cli_main([*args, "--out", str(tmp_path / "eval" / "last-test")])
    assert "holds files already: pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "eval" / "last-test" / "results.csv").read_bytes() == first
    cli_main([*args, "--out", str(tmp_path / "eval" / "last-test"), "--overwrite"])
    assert (tmp_path / "eval" / "last-test" / "notes.txt").read_text() == "mine"


def test_every_role_of_a_checkpoint_is_loaded(tmp_path):
    """Multi2's planner and executor: one folder per role, the config's active role kept."""
    config, overrides = [CONFIGS / "multi2" / "system1_sft.yaml"], TINY
    trained = evaluate.build(config, overrides)
    weights = _perturbed_lora(trained)
    checkpoint = LoRACheckpoint().save(trained.model, tmp_path / "last")
    assert sorted(p.name for p in checkpoint.iterdir() if p.is_dir()) == ["executor", "planner"]
    loaded = evaluate.build(config, overrides, adapter=checkpoint)
    params = dict(loaded.model.policy.named_parameters())
    assert sorted(loaded.model.policy.roles) == ["executor", "planner"]
    assert all(torch.equal(params[name], value) for name, value in weights.items())
    assert loaded.model.policy.active_role == trained.model.policy.active_role == "planner"


def test_rao_trees_reads_a_full_fine_tuning_run(tmp_path, load_research):
    """A run's saved config.yaml (with its fit-only keys) and the whole model LoRACheckpoint
    writes under full fine-tuning: `research/rao_trees.py`, a wrapper over `lit-agents eval`."""
    config = yaml.safe_load((CONFIGS / "rao" / "recursive.yaml").read_text())
    policy = config["model"]["init_args"]["policy"]["init_args"]
    policy.update(model="tiny", tiny={"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                                      "intermediate_size": 64, "corpus": "textcraft_synth"})
    config["data"]["init_args"]["agent"]["init_args"].update(max_new_tokens=6, max_steps=2)
    log_dir = tmp_path / "rao_sft" / "version_0"
    log_dir.mkdir(parents=True)
    (log_dir / "config.yaml").write_text(yaml.safe_dump({**config, "ckpt_path": None}))
    trained = evaluate.build([log_dir / "config.yaml"])
    with torch.no_grad():
        trained.model.policy.model.get_output_embeddings().weight.mul_(3.0)
    LoRACheckpoint().save(trained.model, log_dir / "adapters" / "last")  # -> adapters/last/model

    rao_trees = load_research("rao_trees")
    report = rao_trees.main([str(log_dir), "--splits", "val", "--tasks", "2"])
    assert report["val"]["tasks"] == 2
    assert sum(level["tasks"] for level in report["val"]["by_difficulty"].values()) == 2
    assert json.loads((log_dir / "trees.json").read_text())["val"]["tasks"] == 2
    assert (log_dir / "eval" / "last-val" / "summary.md").exists()

    loaded = evaluate.build([log_dir / "config.yaml"], adapter=log_dir / "adapters" / "last")
    assert loaded.model.policy.name == str(log_dir / "adapters" / "last" / "model")
    assert torch.equal(loaded.model.policy.model.get_output_embeddings().weight,
                       trained.model.policy.model.get_output_embeddings().weight)


def test_multi2_roles_plays_each_role_by_model_or_expert(tmp_path, monkeypatch, load_research):
    """`research/multi2_roles.py` on a Multi2 stage's log folder: the four arms play the same
    tasks, the experts' arm solves what the offline expert solves, an untrained model solves
    none, and the report lands in roles.json."""
    config = yaml.safe_load((CONFIGS / "multi2" / "system1_sft.yaml").read_text())
    config["model"]["init_args"]["policy"]["init_args"].update(
        model="tiny", tiny={"hidden_size": 32, "num_layers": 1, "intermediate_size": 64, "num_heads": 2,
                            "num_kv_heads": 1})
    config["data"]["init_args"]["agent"]["init_args"].update(max_new_tokens=6, plan_tokens=6)
    log_dir = tmp_path / "system2_warmup" / "version_0"
    log_dir.mkdir(parents=True)
    (log_dir / "config.yaml").write_text(yaml.safe_dump(config))
    LoRACheckpoint().save(evaluate.build([log_dir / "config.yaml"]).model, log_dir / "adapters" / "last")

    multi2_roles = load_research("multi2_roles")
    report = multi2_roles.main([str(log_dir), "--splits", "val", "--tasks", "3"])["val"]
    assert list(report) == list(multi2_roles.ARMS)
    assert all(arm["episodes"] == 3 for arm in report.values())
    cli = evaluate.build([log_dir / "config.yaml"])
    tasks = evaluate.held_out(cli, "val", 3, cli.datamodule.seed)
    expert = [cli.datamodule.agent.expert_episode(cli.datamodule.env, t).success for t in tasks]
    assert report["expert / expert"]["success"] == pytest.approx(sum(expert) / 3) and any(expert)
    assert report["model / model"]["success"] == 0.0
    assert report["expert / expert"]["subgoals_met"] > report["model / model"]["subgoals_met"]
    assert json.loads((log_dir / "roles.json").read_text()) == {"val": report}
    again = multi2_roles.main([str(log_dir), "--splits", "val", "--tasks", "3", "--arms", "0"])["val"]
    assert list(again) == ["model / model"]
    assert json.loads((log_dir / "roles.json").read_text()) == {"val": report}  # the other arms kept
    asked = []  # --tasks 0 is the whole split (None), as `lit-agents evaluate` reads it; no --tasks the config's
    monkeypatch.setattr(multi2_roles.evaluate, "evaluate_split",
                        lambda cli, split, tasks, *a: asked.append(tasks) or ([], []))
    multi2_roles.main([str(log_dir), "--splits", "val", "--tasks", "0", "--arms", "0"])
    multi2_roles.main([str(log_dir), "--splits", "val", "--arms", "0"])
    assert asked == [None, config["data"]["init_args"]["val_tasks"]]

    # a first try: not the subgoal just missed again
    tries = [("craft 2 a", False), ("craft 2 a", False), ("craft 2 a", True), ("craft 2 a", True), ("craft 1 b", False)]
    sessions = [Session(i, goal=g, success=met, meta={"role": "executor"}) for i, (g, met) in enumerate(tries)]
    rollout = Rollout("t", 0, [Session(9, meta={"role": "planner"}), *sessions], 0.0, False)
    assert [s.session_id for s in multi2_roles.first_tries(rollout)] == [0, 3, 4]
    assert multi2_roles.arm_stats([rollout])["first_tries_met"] == pytest.approx(1 / 3)


def _rollout(success: bool, depths: list[int], generated: int) -> Rollout:
    sessions = [Session(i, "subagent" if d else "main", 0 if d else None, d,
                        [Call([1, 2], [3] * generated, [0.0] * generated)]) for i, d in enumerate(depths)]
    return Rollout("t", 0, sessions, float(success), success, {"reason": "done", "difficulty": 9})


def test_result_rows_and_summary_by_hand():
    task = Task("t", "goal", meta={"depth": 3})
    row = evaluate.result_row(task, 1, _rollout(True, [0, 1, 2, 1], 4), "depth")
    assert row == {"task_id": "t", "seed": 1, "success": 1, "reward": 1.0, "generated_tokens": 16,
                   "total_tokens": 24, "sessions": 4, "max_depth": 2, "turns": 4, "reason": "done", "depth": 3}
    assert evaluate.result_row(task, 0, _rollout(False, [0], 2), "difficulty")["difficulty"] == 9  # rollout meta
    clash = Task("t", "goal", meta={"sessions": 99})
    assert evaluate.result_row(clash, 0, _rollout(False, [0], 2), "sessions")["sessions"] == 1  # a column wins
    assert evaluate.result_row(task, 0, _rollout(False, [0], 2), "nope")["nope"] == "-"

    rows = [  # seed 0: 2 of 2 solved; seed 1: 1 of 3 solved
        {"seed": 0, "success": 1, "depth": 3, "reward": 1.0, "generated_tokens": 10, "total_tokens": 100, "turns": 2,
         "sessions": 1, "max_depth": 0},
        {"seed": 0, "success": 1, "depth": 2, "reward": 1.0, "generated_tokens": 20, "total_tokens": 200, "turns": 4,
         "sessions": 3, "max_depth": 2},
        {"seed": 1, "success": 0, "depth": 3, "reward": 0.0, "generated_tokens": 30, "total_tokens": 300, "turns": 6,
         "sessions": 1, "max_depth": 0},
        {"seed": 1, "success": 1, "depth": 10, "reward": 1.0, "generated_tokens": 40, "total_tokens": 400, "turns": 8,
         "sessions": 1, "max_depth": 0},
        {"seed": 1, "success": 0, "depth": 2, "reward": 0.0, "generated_tokens": 50, "total_tokens": 500, "turns": 10,
         "sessions": 2, "max_depth": 1},
    ]
    overall, *groups = evaluate.summarize(rows, "depth")
    assert [g["group"] for g in groups] == [2, 3, 10]  # numeric order, not text order
    assert overall["n"] == 5 and overall["success"] == pytest.approx(3 / 5)
    assert overall["success_std"] == pytest.approx(((1 - 2 / 3) ** 2 + (1 / 3 - 2 / 3) ** 2) ** 0.5)  # stdev(1, 1/3)
    assert (overall["generated_tokens"], overall["sessions"], overall["max_depth"]) == (30.0, 1.6, 0.6)
    depth2 = groups[0]
    assert (depth2["n"], depth2["success"], depth2["sessions"]) == (2, 0.5, 2.5)
    assert depth2["success_std"] == pytest.approx(0.5 ** 0.5)  # stdev(1, 0)
    table = evaluate.markdown([overall, *groups], "depth")
    assert "| depth | n | success |" in table and "| all | 5 | 60.0% ± 47.1 | 0.60 | 30.0 | 300.0 |" in table
    assert evaluate.summarize(rows, None) == [overall]
    assert evaluate.summarize(rows, "nope") == [overall]  # no row has the key: overall only


def test_default_out():
    assert evaluate.default_out("configs/quickstart.yaml", None, "val") == Path("runs/eval/quickstart-val")
    run = Path("runs/rl/version_0")
    assert evaluate.default_out("c.yaml", run / "adapters" / "last", "test") == run / "eval" / "last-test"
    assert evaluate.default_out("c.yaml", run / "adapters" / "best" / "model", "val") == run / "eval" / "best-val"
    assert evaluate.default_out("c.yaml", Path("/x/my_adapter"), "val") == Path("/x/my_adapter-eval-val")


@pytest.fixture
def paired_eval(load_research):
    """`research/paired_eval.py`, loaded as a module."""
    return load_research("paired_eval")


def test_paired_eval_counts_tasks_gained_and_lost_on_the_same_rollouts(tmp_path, capsys, paired_eval):
    """`research/paired_eval.py`: two evaluation folders written by `evaluate.write` are paired on
    (task, seed); the gains, losses and the exact sign test are counted by hand, and folders of
    different rollouts are refused rather than compared."""

    def folder(name: str, successes: list[bool], seeds: list[int]) -> Path:
        rows = [evaluate.result_row(Task(f"t{i % 4}", "goal"), seed, _rollout(ok, [0], 2))
                for i, (ok, seed) in enumerate(zip(successes, seeds))]
        evaluate.write(tmp_path / name, rows, [], None)
        return tmp_path / name

    seeds = [0, 0, 0, 0, 1, 1, 1, 1]  # four tasks under two sampling seeds
    start = folder("start", [True, False, False, False, True, False, True, False], seeds)
    after = folder("after", [True, True, True, False, False, True, True, True], seeds)
    [result] = paired_eval.main([str(start), str(after)])
    assert (result.n, result.gained, result.lost) == (8, 4, 1)
    assert (result.reference, result.success, result.change) == (37.5, 75.0, 37.5)
    assert result.p == pytest.approx(2 * (1 + 5) / 32)  # P(at most 1 of 5 discordant pairs goes one way), two-sided
    assert paired_eval.sign_test(3, 3) == 1.0 and paired_eval.sign_test(0, 0) == 1.0
    assert "gained 4, lost 1" in capsys.readouterr().out

    other = folder("other", [True] * 8, [0, 0, 0, 0, 2, 2, 2, 2])  # another sampling seed: not the same draws
    with pytest.raises(ValueError, match="different"):
        paired_eval.main([str(start), str(other)])
    with pytest.raises(FileNotFoundError, match="results.csv"):
        paired_eval.outcomes(tmp_path / "missing")


def test_paired_eval_role_sharpness_reads_the_sampled_tokens_of_that_role(tmp_path, capsys, paired_eval):
    """`paired_eval.py --role`: the mean log-prob of one role's sampled tokens, the share of its
    actions with a token drawn at p < 0.1 and its actions per rollout, counted by hand; other
    roles' calls are not counted, and a role with no action is an error, not a 0."""
    rare, sure = -3.0, -0.1  # p ~ 0.05 (below 0.1) and p ~ 0.9

    def rollout(task: str, executor: list[list[float]]) -> Rollout:
        planner = Call([1], [2], [-5.0], role="planner")  # rare, but not the executor's
        calls = [Call([1], [3] * len(lps), lps, role="executor") for lps in executor]
        return Rollout(task, 0, [Session(0, "main", None, 0, [planner, *calls])], 0.0, False, {"reason": "done"})

    rollouts = [rollout("a", [[sure, sure], [rare]]), rollout("b", [[sure, rare, sure]])]
    rows = [evaluate.result_row(Task(r.task_id, "goal"), 0, r) for r in rollouts]
    evaluate.write(tmp_path / "run", rows, rollouts, None)
    s = paired_eval.sharpness(tmp_path / "run", "executor")
    assert s.logprob == pytest.approx((4 * sure + 2 * rare) / 6)
    assert (s.rare, s.per_rollout) == (pytest.approx(100 * 2 / 3), 1.5)
    paired_eval.main(["--role", "executor", str(tmp_path / "run"), str(tmp_path / "run")])
    assert "actions with a token at p < 0.1 66.7%, 1.5 actions a rollout" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no action of role 'critic'"):
        paired_eval.sharpness(tmp_path / "run", "critic")


def test_multi2_critic_ranks_the_offline_stages_actions(tmp_path, load_research):
    """`research/multi2_critic.py` on a Multi2 offline stage's log folder: each demonstration
    action is labelled expert or not, A = Q - V is the heads' (here 0.25 - (-0.75)), the cloning
    weights put on the non-expert actions exactly their share, and a checkpoint without the
    critic heads is refused."""
    from lit_agents.data.demos import write_episodes

    multi2_critic = load_research("multi2_critic")
    assert multi2_critic.auc(torch.tensor([0.3, 0.1, -0.2, 0.1]), torch.tensor([True, True, False, False])) == 0.875

    config = yaml.safe_load((CONFIGS / "multi2" / "system2_offline.yaml").read_text())
    config["model"]["init_args"]["policy"]["init_args"] = {
        "model": "tiny", "roles": ["executor", "planner"], "lora_r": 4,
        "tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64, "num_heads": 2, "num_kv_heads": 1}}
    config["model"]["init_args"]["head_width"] = 8
    config["data"]["init_args"].update(path=str(tmp_path / "demos.jsonl"), generate=True, val_tasks=2)
    log_dir = tmp_path / "system2_offline" / "version_0"
    (log_dir / "checkpoints").mkdir(parents=True)
    (log_dir / "config.yaml").write_text(yaml.safe_dump(config))
    cli = evaluate.build([log_dir / "config.yaml"])
    env, agent = cli.datamodule.env, cli.datamodule.agent
    tasks = list(env.tasks("train"))[:4]
    episodes = [agent.expert_episode(env, t, eps, seed=k) for k, (t, eps) in enumerate(zip(tasks, [0, 1, 0, 1]))]
    write_episodes(episodes, tmp_path / "demos.jsonl")
    labels = [multi2_critic.expert_labels(env, e) for e in episodes]
    assert [len(x) for x in labels] == [len(e.steps) for e in episodes]
    assert all(labels[0]) and all(labels[2]) and not all(labels[1]) and not all(labels[3])
    others = sum(not x for lab in labels for x in lab)

    module = cli.model
    with torch.no_grad():
        for head, value in ((module.q, 0.25), (module.v, -0.75)):
            for p in head.parameters():
                p.zero_()
            head.net[-1].bias.fill_(value)
    torch.save({"state_dict": module.state_dict()}, log_dir / "checkpoints" / "last.ckpt")
    report = multi2_critic.main([str(log_dir), "--episodes", "0"])
    steps = sum(len(e.steps) for e in episodes)
    assert report["episodes"] == 4 and report["other"]["actions"] == others
    assert report["expert"]["actions"] + report["other"]["actions"] == steps
    assert report["expert"]["mean"] == pytest.approx(1.0) and report["other"]["positive"] == 1.0
    assert report["other_mass"]["uniform (cloning)"] == pytest.approx(others / steps)
    assert report["other_mass"]["1[A > 0]"] == pytest.approx(others / steps)
    assert json.loads((log_dir / "critic.json").read_text())["other"]["actions"] == others

    state = {k: v for k, v in module.state_dict().items() if not k.startswith("q.")}
    torch.save({"state_dict": state}, log_dir / "checkpoints" / "last.ckpt")
    with pytest.raises(ValueError, match="missing heads"):
        multi2_critic.main([str(log_dir)])
