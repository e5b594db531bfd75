"""`lit-agents multi2 --short`: every stage fits and hands its adapters to the next."""

from __future__ import annotations

import json

import pytest
import yaml
from peft import PeftConfig

from lit_agents.cli import main


def test_multi2_pipeline_short(tmp_path, capsys):
    out = tmp_path / "m2"
    main(["multi2", "--short", "--out", str(out), "--config-dir", "configs/multi2"])
    results = json.loads((out / "results.json").read_text())
    assert list(results["stages"]) == ["backbone", "system1_sft", "system2_warmup", "system2_offline",
                                       "system2_online", "flat_sft", "flat_grpo"]
    for stage in results["stages"].values():
        assert set(stage) >= {"seconds", "val", "test"} and 0.0 <= stage["test"]["success"] <= 1.0
        assert sum(stage["val"]["tasks_by_depth"].values()) == stage["val"]["tasks"]
    for role, folder in (("planner", "system1"), ("executor", "warmup"), ("executor", "offline")):
        assert PeftConfig.from_pretrained(str(out / "adapters" / folder / role)).r == 32
    assert (out / "offline_demos.jsonl").exists() and (out / "backbone_model" / "config.json").exists()
    printed = capsys.readouterr().out
    assert "| system2_online |" in printed and "depth 2" in printed

    # --stages refits only the named stages on what the run left, and keeps the other results
    before = results["stages"]
    main(["multi2", "--short", "--out", str(out), "--config-dir", "configs/multi2", "--stages", "flat_sft"])
    after = json.loads((out / "results.json").read_text())["stages"]
    assert list(after) == list(before)
    assert after["backbone"] == before["backbone"] and after["flat_sft"]["seconds"] != before["flat_sft"]["seconds"]
    # an opt-in stage (not in the default run above) fits when named, from the offline executor
    main(["multi2", "--short", "--out", str(out), "--config-dir", "configs/multi2", "--stages", "system2_grpo"])
    stages = json.loads((out / "results.json").read_text())["stages"]
    assert list(stages) == [*list(before)[:5], "system2_grpo", *list(before)[5:]]
    assert 0.0 <= stages["system2_grpo"]["val"]["success"] <= 1.0 and stages["system2_grpo"]["from"] == "offline"
    # --online-from warmup: the online stage starts from, and is anchored to, the warm-up executor
    main(["multi2", "--short", "--out", str(out), "--config-dir", "configs/multi2", "--stages", "system2_grpo",
          "--online-from", "warmup"])
    assert json.loads((out / "results.json").read_text())["stages"]["system2_grpo"]["from"] == "warmup"
    config = yaml.safe_load(sorted((out / "system2_grpo").glob("version_*/config.yaml"))[-1].read_text())
    policy = config["model"]["init_args"]["policy"]["init_args"]
    warm = str(out / "adapters" / "warmup" / "executor")
    assert policy["adapters"] == {"executor": warm} and policy["frozen_adapters"]["executor_offline"] == warm
    with pytest.raises(SystemExit):
        main(["multi2", "--short", "--out", str(out), "--config-dir", "configs/multi2", "--stages", "nope"])
    assert "error: unknown stage" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["multi2", "--short", "--out", str(out), "--seed", "1", "--config-dir", "configs/multi2",
              "--stages", "flat_sft"])
    assert "seed 0, not 1" in capsys.readouterr().err


def test_dry_run_prints_each_stage_it_would_fit_and_fits_nothing(tmp_path, capsys):
    out = tmp_path / "m2"
    main(["multi2", "--dry-run", "--out", str(out), "--config-dir", "configs/multi2",
          "--stages", "system1_sft,system2_warmup", "--set", "model.init_args.policy.init_args.model=smollm2-135m"])
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == ["[multi2] system1_sft", "[multi2] system2_warmup"]
    # a --set override comes after the pipeline's own (a pretrained model in place of the backbone)
    assert printed[0].endswith("--model.init_args.policy.init_args.model=smollm2-135m")
    assert f"--trainer.logger.init_args.save_dir={out}" in printed[1] and not out.exists()


def test_dry_run_stops_on_a_key_that_a_stage_does_not_have(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["multi2", "--dry-run", "--out", str(tmp_path), "--config-dir", "configs/multi2",
              "--set", "system2_offline:model.init_args.gama=0.9"])
    assert exit_.value.code != 0
    assert "[multi2] system2_offline: these arguments do not parse" in capsys.readouterr().err
