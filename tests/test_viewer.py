"""Seeing what the agent did: advantages in saved rollouts, the `lit-agents view` page (layout,
escaping, offline; rendered in headless Chromium), and `RolloutSamples` in TensorBoard."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lit_agents.agents import ReActAgent, written_call
from lit_agents.agents.multisession import MultiSessionAgent
from lit_agents.algorithms.collate import record_advantages, session_rows
from lit_agents.callbacks import RolloutSamples
from lit_agents.callbacks.rollout_samples import clip, pick_samples, rollout_markdown
from lit_agents.cli import main as cli
from lit_agents.data import RolloutDataModule
from lit_agents.modules import GRPOPolicy, MosaicPolicy
from lit_agents.modules.base import AgentModule, training_rollouts
from lit_agents.policy import AgentPolicy
from lit_agents.types import Call, Rollout, Session
from lit_agents.viewer import edges, layout, read_rollouts, render_html

CHROMIUM = Path("/usr/bin/chromium")
EVIL = "</script><script>alert('x')</script> & <b>bold</b> <!--"


def _call(prompt: str, completion: str) -> Call:
    return Call([1] * (len(prompt.split()) + 1), [2, 3], [-0.5, -0.25], prompt_text=prompt, completion_text=completion)


def _chain_with_forks() -> Rollout:
    """main -> compaction -> compaction along the top, a subagent forked from each of the first two."""
    sessions = [
        Session(0, "main", None, 0, [_call("Goal: craft 1 acacia door.", "fork: craft 6 acacia planks"),
                                     _call("Subagent: done", "compact")]),
        Session(1, "subagent", 0, 1, [_call("Your goal: craft 6 acacia planks", "craft 6 acacia planks")], reward=1.0,
                goal="craft 6 acacia planks", success=True),
        Session(2, "compaction", None, 0, [_call("Summary: 6 planks", "fork: craft 1 acacia door")]),
        Session(3, "subagent", 2, 1, [_call("Your goal: craft 1 acacia door", EVIL)], reward=0.0,
                goal="craft 1 acacia door", success=False),
        Session(4, "compaction", None, 0, [_call("Summary: ...", "craft 1 acacia door")]),
    ]
    return Rollout("textcraft/acacia_door", 3, sessions, reward=1.0, success=True, meta={"compactions": 2, "forks": 2})


def _tree() -> Rollout:
    """An execution tree: 0 -> (1 -> (3, 4), 2 -> 5)."""
    parents = [None, 0, 0, 1, 1, 2]
    sessions = [Session(i, "main" if p is None else "subagent", p, 0 if p is None else (1 if p == 0 else 2),
                        [_call(f"goal {i}", "code")], reward=float(i % 2)) for i, p in enumerate(parents)]
    return Rollout("synth/tree", 1, sessions, reward=0.0, success=False, meta={"nodes": 6})


# ---------------------------------------------------------------------------- layout and page
def test_layout_puts_the_compaction_chain_in_a_row_and_forks_below():
    sessions = _chain_with_forks().sessions
    assert layout(sessions) == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (2, 0)}
    assert edges(sessions) == [(0, 1, "child"), (0, 2, "next"), (2, 3, "child"), (2, 4, "next")]


def test_layout_centres_each_parent_over_its_children():
    # leaves 3, 4, 5 take columns 0, 1, 2; node 1 sits over (0 + 1) / 2, node 2 over 2, the root over (0.5 + 2) / 2
    assert layout(_tree().sessions) == {0: (1.25, 0), 1: (0.5, 1), 2: (2.0, 1), 3: (0, 2), 4: (1, 2), 5: (2, 2)}


def test_layout_places_every_session_despite_missing_parents_and_cycles():
    sessions = [Session(0, parent=1), Session(1, parent=0), Session(2, parent=9), Session(3, parent=3)]
    pos = layout(sessions)
    assert set(pos) == {0, 1, 2, 3} and len(set(pos.values())) == 4
    assert layout([]) == {}


def _page_data(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_page_escapes_text_and_references_nothing_online():
    page = render_html([_chain_with_forks(), _tree()], title="a <title>")
    assert page.count("</script>") == 2 and page.count("<script") == 2  # the data tag and the code, no more
    assert "<script>alert" not in page and "<!--" not in page.split("<html")[1]
    assert "http://" not in page and "https://" not in page and "@import" not in page
    assert "<title>a &lt;title&gt; · lit-agents rollouts</title>" in page
    data = _page_data(page)  # the text survives the escaping exactly
    assert data["rollouts"][0]["sessions"][3]["calls"][0]["completion"] == EVIL
    assert [(s["x"], s["y"]) for s in data["rollouts"][1]["sessions"]] == [
        (1.25, 0),
        (0.5, 1),
        (2, 1),
        (0, 2),
        (1, 2),
        (2, 2),
    ]


def test_view_command_writes_the_page_and_prints_its_path(tmp_path, capsys):
    path = tmp_path / "val-epoch0000-rank0.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in [_chain_with_forks(), _tree(), _tree()]))
    cli(["view", str(path), "--limit", "2"])
    out = tmp_path / "val-epoch0000-rank0.html"
    assert capsys.readouterr().out.strip() == str(out)
    data = _page_data(out.read_text())
    assert [r["task"] for r in data["rollouts"]] == ["textcraft/acacia_door", "synth/tree"]
    assert data["rollouts"][1]["source"] == "val-epoch0000-rank0.jsonl:2"
    cli(["view", str(path), str(path), "--out", str(tmp_path / "both.html")])
    assert len(_page_data((tmp_path / "both.html").read_text())["rollouts"]) == 6
    assert len(read_rollouts([path], limit=0)) == 0
    cli(["view", str(tmp_path), "--out", str(tmp_path / "folder.html")])  # a folder: its JSONL files
    assert len(_page_data((tmp_path / "folder.html").read_text())["rollouts"]) == 3


# ---------------------------------------------------------------------------- advantages in saved rollouts
def test_each_trained_sessions_advantage_is_recorded_and_saved():
    rollout = _chain_with_forks()
    rollout.sessions.append(Session(5, "subagent", 0, 1))  # no call: no row, nothing trained, no advantage
    rows = session_rows([rollout], [[0.5, 0.7, 0.2, -0.4, 0.5, 0.1]])
    assert len(rows) == 5 and all(s.advantage is None for s in rollout.sessions)
    record_advantages([rollout], rows)
    assert [s.advantage for s in rollout.sessions] == [0.5, 0.7, 0.2, -0.4, 0.5, None]
    assert Rollout.from_dict(json.loads(json.dumps(rollout.to_dict()))).sessions[3].advantage == -0.4
    old = rollout.to_dict()  # saved before the advantage was a field: it lived in meta
    old["sessions"][3]["meta"]["advantage"] = old["sessions"][3].pop("advantage")
    assert Rollout.from_dict(old).sessions[3].advantage == -0.4


def test_a_sessions_goal_success_and_progress_are_fields_and_old_files_still_load():
    """Saved rollouts round-trip the typed fields; files saved when they lived in ``meta`` (and
    Multi2's executor kept ``met`` and ``subgoal``) load into the fields."""
    rollout = _chain_with_forks()
    sub = rollout.sessions[1]
    assert (sub.goal, sub.success) == ("craft 6 acacia planks", True)
    assert Rollout.from_dict(json.loads(json.dumps(rollout.to_dict()))) == rollout

    def old(meta):
        return {"session_id": 0, "kind": "main", "parent": None, "depth": 0, "calls": [], "reward": None, "meta": meta}

    saved = {"task_id": "t", "group_id": 0, "reward": 0.0, "success": False, "meta": {}, "sessions": [
        old({"progress_before": 0.1, "progress_after": 0.5, "steps": 3}),
        old({"goal": "craft 1 x", "success": True, "goal_progress_before": 0.0, "goal_progress_after": 1.0}),
        old({"role": "executor", "subgoal": "craft 2 y", "met": False, "rewards": [0.0]}),
    ]}
    main, child, executor = Rollout.from_dict(saved).sessions
    assert (main.progress_before, main.progress_after, main.meta) == (0.1, 0.5, {"steps": 3})
    assert (child.goal, child.success, child.goal_progress_after, child.meta) == ("craft 1 x", True, 1.0, {})
    assert (executor.goal, executor.success) == ("craft 2 y", False)
    assert executor.meta == {"role": "executor", "rewards": [0.0]}


@pytest.fixture(scope="module")
def policy(tiny_config):
    return AgentPolicy(tiny=tiny_config, lora_r=4)


def test_fit_saves_train_rollouts_with_advantages_and_logs_samples_to_tensorboard(policy, textcraft, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=4, max_steps=2), tasks_per_epoch=2, group_size=2,
                             val_tasks=2, save_rollouts=True)
    logger = TensorBoardLogger(tmp_path, name="run")
    trainer = Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=logger, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=1,
                      num_sanity_val_steps=0, callbacks=[RolloutSamples(samples=2)])
    trainer.fit(GRPOPolicy(policy, drop_zero_signal=False), datamodule=data)
    folder = Path(logger.log_dir) / "rollouts"
    train = read_rollouts([folder / "train-epoch0000-rank0.jsonl"])
    val = read_rollouts([folder / "val-epoch0000-rank0.jsonl"])
    assert len(train) == 4 and len(val) == 2
    assert all(isinstance(s.advantage, float) for _, r in train for s in r.sessions)
    assert all(s.advantage is None for _, r in val for s in r.sessions)  # no rows, no advantages
    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0, "images": 0})
    events.Reload()
    assert "rollout/graph" in events.Tags()["images"]
    assert "rollout/samples/text_summary" in events.Tags()["tensors"]
    text = events.Tensors("rollout/samples/text_summary")[0].tensor_proto.string_val[0].decode()
    assert train[0][1].task_id in text and "turn 1 completion" in text


def test_samples_pick_the_largest_rollout_then_the_other_outcome():
    small_win = Rollout("a", 0, [Session(0, calls=[_call("p", "c")])], success=True)
    small_loss = Rollout("b", 0, [Session(0, calls=[_call("p", "c")])])
    picked = pick_samples([small_win, small_loss, _chain_with_forks(), _tree()], 3)
    assert [r.task_id for r in picked] == ["synth/tree", "textcraft/acacia_door", "a"]
    assert clip("x" * 10, 10) == "x" * 10 and clip("abcdefghij" * 3, 10) == "abcde\n[... 20 chars ...]\nfghij"
    text = rollout_markdown(_chain_with_forks(), max_turns=1, max_sessions=2)
    assert "*... 1 more turns*" in text and "*... 3 more sessions*" in text
    assert "    fork: craft 6 acacia planks" in text  # texts go in indented code blocks


def test_samples_skip_quietly_without_a_tensorboard_logger(tmp_path):
    trainer = SimpleNamespace(is_global_zero=True, current_epoch=0, global_step=0, loggers=[CSVLogger(tmp_path)])
    module = AgentModule.__new__(AgentModule)  # a module fed one rollout (no policy needed here)
    object.__setattr__(module, "data_module", SimpleNamespace(last_rollouts=[_tree()]))
    assert training_rollouts(module)
    RolloutSamples().on_train_epoch_start(trainer, module)
    assert not list(tmp_path.rglob("events.out.tfevents*"))


# ---------------------------------------------------------------------------- the page in a browser
class _Scripted(MultiSessionAgent):
    """Forks a subagent, compacts, then finishes, writing the expert's actions instead of sampling."""

    def __init__(self, env, **kw):
        super().__init__(compaction=True, forking=True, context_budget=10_000, system_prompt="", **kw)
        self.env = env

    def script(self, line) -> str:
        state, episode = line.episode.state, line.episode
        if line.summarizing:
            return "SUMMARY: the planks are made"
        if line.parent is not None:
            return self.env.expert_subgoal_action(state, line.goal)
        if line.session.kind == "main":
            return "compact" if episode.forks else "fork: craft 6 acacia planks"
        return self.env.expert_action(state)

    def complete(self, policy, engine, lines, params, generator, version):
        texts = [self.script(line) for line in lines]
        for line, text in zip(lines, texts):
            line.session.calls.append(written_call(policy, line.pending, line.pending_text, text, "default"))
        return texts


def _chromium(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1400,1000"]
    return subprocess.run([str(CHROMIUM), *flags, *args, url], capture_output=True, text=True, timeout=90, check=True)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="headless check needs /usr/bin/chromium (apt-get install chromium)")
def test_page_of_multisession_rollouts_renders_in_headless_chromium(policy, textcraft, tmp_path):
    rollouts = _Scripted(textcraft).run(policy, textcraft, [textcraft.tasks("train")[1]], group_size=2)
    record_advantages(rollouts, MosaicPolicy(policy, drop_zero_signal=False).rollouts_to_rows(rollouts))
    first = rollouts[0]
    assert [s.kind for s in first.sessions] == ["main", "subagent", "compaction"]
    path = tmp_path / "train-epoch0000-rank0.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in [*rollouts, _chain_with_forks()]))
    page = tmp_path / "page.html"
    cli(["view", str(path), "--out", str(page)])

    dom = _chromium(page.as_uri(), tmp_path, "--dump-dom").stdout  # the first rollout, its root session
    assert dom.count('<g class="node') == len(first.sessions)
    assert dom.count('<li class="turn"') == len(first.sessions[0].calls)
    assert html.escape(first.sessions[0].calls[0].completion_text, quote=False) in dom
    advantage = first.sessions[0].advantage
    assert f"advantage<b>{'+' if advantage > 0 else ''}{advantage:.3f}</b>" in dom

    dom = _chromium(page.as_uri() + "#r=2&s=3", tmp_path, "--dump-dom").stdout  # session 3 of the hand-built rollout
    assert dom.count('<g class="node') == 5 and dom.count('<li class="turn"') == 1
    assert html.escape(EVIL, quote=False) in dom and dom.count("<script") == 2  # shown as text, never run

    shot = tmp_path / "page.png"
    _chromium(page.as_uri(), tmp_path, f"--screenshot={shot}")
    assert shot.stat().st_size > 20_000


@pytest.mark.skipif(not CHROMIUM.exists(), reason="headless check needs /usr/bin/chromium (apt-get install chromium)")
def test_page_shows_no_null_for_a_session_without_goal_text(tmp_path):
    sessions = [Session(0, "main", None, 0, [_call("Goal: craft 1 acacia door.", "fork:")]),
                Session(1, "subagent", 0, 1, [_call("Your goal:", "done")], success=False)]
    rollout = Rollout("textcraft/acacia_door", 0, sessions, meta={"reason": None, "steps": 2})
    page = tmp_path / "page.html"
    page.write_text(render_html([rollout]))
    for session in (0, 1):
        dom = _chromium(page.as_uri() + f"#r=0&s={session}", tmp_path, "--dump-dom").stdout
        shown = re.sub(r"<script.*?</script>", "", dom, flags=re.S)  # the page's data holds JSON nulls
        assert f"Session #{session}" in shown and "null" not in shown


def test_view_skips_bad_lines_with_a_count_and_refuses_an_empty_input(tmp_path, capsys):
    """A run killed mid-write leaves half a line: the page shows the rest and says how many lines
    were skipped (``--strict`` stops at it); an input without rollouts is an error, not an empty page."""
    path = tmp_path / "train-epoch0003-rank0.jsonl"
    good = json.dumps(_tree().to_dict())
    path.write_text(f"{good}\n{{\"not\": \"a rollout\"}}\n{good}\n{good[: len(good) // 2]}")
    cli(["view", str(path), "--out", str(tmp_path / "page.html")])
    captured = capsys.readouterr()
    assert captured.out.strip() == str(tmp_path / "page.html")
    assert f"skipped 2 line(s) that are not saved rollouts, e.g. {path}:2" in captured.err
    assert len(_page_data((tmp_path / "page.html").read_text())["rollouts"]) == 2
    with pytest.raises(SystemExit):
        cli(["view", str(path), "--strict", "--out", str(tmp_path / "strict.html")])
    assert f"{path}:2: not a saved rollout" in capsys.readouterr().err and not (tmp_path / "strict.html").exists()

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SystemExit):
        cli(["view", str(empty)])
    assert f"no rollouts in {empty}" in capsys.readouterr().err and not (tmp_path / "empty.html").exists()
