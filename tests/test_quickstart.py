"""The README's main command in a short form: both stages run and the table comes out.

The full run (``make quickstart``, 11-21 minutes by the day) is marked slow; CI runs the short form only.
``LIT_AGENTS_SLOW=1 pytest -m slow`` runs the full one and checks the learning claim.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from lit_agents.pipelines import quickstart
from lit_agents.pipelines.quickstart import main

CONFIGS = Path(__file__).parents[1] / "configs"
# stage 1 on the embedded default at a toy size: `--config` stacks the overlay where it stands
TINY = [f"config={CONFIGS / 'debug' / 'tiny_model.yaml'}"]
SHORT = [
    "trainer.max_epochs=1",
    "trainer.check_val_every_n_epoch=1",
    "trainer.enable_progress_bar=false",
    "data.init_args.val_tasks=3",
    "data.init_args.agent.init_args.max_new_tokens=8",
    "data.init_args.agent.init_args.max_steps=2",
]


def test_quickstart_short(tmp_path, capsys, monkeypatch):
    played = []  # tasks each held-out evaluation played, and the val_tasks it left behind
    success = quickstart._success

    def counting(cli, split):
        played.append(len(cli.datamodule.held_out_tasks(split)))
        return success(cli, split)

    monkeypatch.setattr(quickstart, "_success", counting)
    results = main([
        "--config-dir", str(CONFIGS), "--out", str(tmp_path), "--untrained-tasks", "2",
        "--sft", *SHORT, *TINY, "data.init_args.demos=8",
        "--rl", *SHORT, "data.init_args.tasks_per_epoch=2", "data.init_args.group_size=2",
    ])
    # the untrained row on the first 2 tasks of each split, every later row on all 3
    assert played == [2, 2, 3, 3, 3, 3] and results["untrained_tasks"] == 2
    out = capsys.readouterr().out
    assert "the untrained row on the first 2 of them" in out
    assert "| after RL" in out and "unseen goal items" in out
    for stage in ("untrained", "sft", "rl"):
        assert set(results[stage]) == {"val", "test"}
        assert all(0.0 <= v <= 1.0 for v in results[stage].values())
    assert (tmp_path / "sft_model" / "config.json").exists()
    assert (Path(results["rl_adapters"]) / "default" / "adapter_config.json").exists()
    assert (tmp_path / "results.json").exists()
    # the newcomer's viewer page: held-out rollouts after RL, then the last training epoch's
    page = (tmp_path / "rollouts.html").read_text()
    assert results["rollouts_page"] == str(tmp_path / "rollouts.html") and "Rollouts:" in out
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))
    sources = [r["source"].split(":")[0] for r in data["rollouts"]]
    assert len(sources) == 3 * 2 + 2 * 2  # 3 held-out tasks x 2 splits, then 2 train tasks x group 2
    assert sources[0].startswith("val-") and sources[-1].startswith("train-")


def test_quickstart_refuses_an_out_folder_that_holds_an_earlier_run(tmp_path, capsys):
    """A second quick start into the same --out would replace the SFT model under the first run's
    RL adapters: refused before anything is written."""
    from lit_agents.cli import main as cli_main

    (tmp_path / "sft_model").mkdir()
    (tmp_path / "sft_model" / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        cli_main(["quickstart", "--config-dir", str(CONFIGS), "--out", str(tmp_path), "--untrained-tasks", "1",
                  "--sft", *SHORT, *TINY, "data.init_args.demos=4", "--rl", *SHORT, "data.init_args.tasks_per_epoch=1",
                  "data.init_args.group_size=2"])
    assert "holds an earlier quick start" in capsys.readouterr().err
    assert [p.name for p in tmp_path.rglob("*")] == ["sft_model", "config.json"]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("LIT_AGENTS_SLOW") != "1", reason="full quick start: set LIT_AGENTS_SLOW=1")
def test_quickstart_full_learns(tmp_path):
    """The claims on unseen instances of the practised goals (``val``): 20 points above the
    untrained model after RL, and RL 5 points above SFT (seeds 0-2 gained 10-20 points; the
    unseen goal items, ``test``, stay near 10%: docs/results.md, Quick start)."""
    results = main(["--config-dir", str(CONFIGS), "--out", str(tmp_path)])
    assert results["rl"]["val"] >= results["untrained"]["val"] + 0.20
    assert results["rl"]["val"] >= results["sft"]["val"] + 0.05


def test_dry_run_prints_both_stages_and_fits_nothing(tmp_path, capsys):
    """``--dry-run``: the RL stage's command reads the model the SFT stage saves; nothing is written."""
    out = tmp_path / "qs"
    assert main(["--config-dir", str(CONFIGS), "--out", str(out), "--dry-run", "--rl", "trainer.max_epochs=2"]) == {}
    sft, rl = capsys.readouterr().out.splitlines()
    assert sft.startswith("[quickstart] sft: lit-agents fit -c") and "quickstart.yaml" in sft
    assert f"--model.init_args.policy.init_args.model={out / 'sft_model'}" in rl
    assert rl.endswith("--trainer.max_epochs=2")
    assert not out.exists()
    with pytest.raises(SystemExit):
        main(["--config-dir", str(CONFIGS), "--out", str(out), "--dry-run", "--sft", "trainer.max_epoks=1"])
