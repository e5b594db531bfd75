"""Bad input gets a clear error and loses nothing: a failed resume leaves the run's record as it
was, results are never overwritten silently, settings that cannot train fail at construction,
and errors while building print the library's own sentence."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_agents.cli import main

ROOT = Path(__file__).parents[1] / "configs"
DEBUG = ROOT / "debug"


def rl_fit(save_dir: Path, *extra: str, tiny: bool = True) -> list[str]:
    """`lit-agents fit` arguments of the quick start's RL stage on the toy model (``tiny``), in seconds."""
    model = ["--model.init_args.policy.init_args.model=tiny", "-c", str(DEBUG / "tiny_model.yaml")] if tiny else []
    return ["fit", "-c", str(ROOT / "quickstart_rl.yaml"), "-c", str(DEBUG / "short.yaml"),
            "-c", str(DEBUG / "short_rollouts.yaml"), *model, f"--trainer.default_root_dir={save_dir}",
            f"--trainer.logger.init_args.save_dir={save_dir}", *extra]


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


#: every epoch updates the toy model's weights (an untrained model has no signal)
UPDATES = ("-c", str(DEBUG / "always_update.yaml"))


@pytest.fixture()
def one_epoch_run(tmp_path) -> Path:
    """A finished run of one epoch that updated its weights (one optimizer step)."""
    main(rl_fit(tmp_path, *UPDATES, "--trainer.max_epochs=1", "--trainer.limit_train_batches=1"))
    return tmp_path / "quickstart_rl" / "version_0"


# ----------------------------------------------------------------------------- the run's record
def test_a_failed_resume_leaves_the_run_as_it_was_and_its_recipe_resumes_it(one_epoch_run, capsys, console):
    run = one_epoch_run
    before = files(run)
    with pytest.raises(SystemExit):  # the config says r=32: the checkpoint's tensors do not fit r=16
        main(rl_fit(run.parents[1], *UPDATES, "--trainer.max_epochs=2", "--ckpt_path", "last",
                    "--model.init_args.policy.init_args.lora_r=16"))
    assert "last.ckpt does not match this model/adapter configuration" in capsys.readouterr().err
    assert files(run) == before  # no config.yaml rewritten, no events file added

    main(["fit", "-c", str(run / "config.yaml"), "--trainer.max_epochs=2",
          "--ckpt_path", str(run / "checkpoints" / "last.ckpt")])
    assert any("last.ckpt at epoch 1 (step 1)" in line for line in console)
    assert not (run.parent / "version_1").exists()  # the run's own folder
    assert (run / "config.yaml").read_bytes() == before["config.yaml"]
    assert "max_epochs: 2" in (run / "config-resume-1.yaml").read_text()
    assert (run / "checkpoints" / "epoch=1-step=2.ckpt").exists()


def test_a_corrupt_last_checkpoint_names_the_readable_one_beside_it(one_epoch_run, capsys):
    run = one_epoch_run
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:3000])  # a half-copied file
    before = files(run)
    with pytest.raises(SystemExit):
        main(rl_fit(run.parents[1], *UPDATES, "--trainer.max_epochs=2", "--ckpt_path", "last"))
    err = capsys.readouterr().err
    assert "cannot read checkpoint" in err
    assert "readable checkpoints beside it, newest first: epoch=0-step=1.ckpt" in err
    assert files(run) == before


def test_a_pinned_version_folder_of_an_earlier_run_is_refused_unless_resuming(one_epoch_run, capsys):
    run = one_epoch_run
    before = files(run)
    with pytest.raises(SystemExit):
        main(rl_fit(run.parents[1], *UPDATES, "--trainer.logger.init_args.version=0"))
    assert "holds an earlier run" in capsys.readouterr().err
    assert files(run) == before
    main(rl_fit(run.parents[1], *UPDATES, "--trainer.logger.init_args.version=0", "--trainer.max_epochs=2",
                "--trainer.limit_train_batches=1", "--ckpt_path", str(run / "checkpoints" / "last.ckpt")))
    assert (run / "checkpoints" / "epoch=1-step=2.ckpt").exists() and not (run.parent / "version_1").exists()


# ----------------------------------------------------------------------------- errors without tracebacks
@pytest.mark.parametrize(("setting", "message"), [
    ("model=nosuchmodel", "unknown model 'nosuchmodel'"),
    ("model={empty}", "is neither a checkpoint folder (no config.json) nor holds a .gguf file"),
    ("merge_adapter={empty}/sft/adapters/last/default", "merge_adapter: no peft adapter at"),
], ids=["unknown model", "empty model folder", "missing merge_adapter"])
def test_an_error_while_building_prints_the_librarys_sentence_alone(tmp_path, capsys, monkeypatch, setting, message):
    (tmp_path / "empty").mkdir()
    argv = rl_fit(tmp_path, f"--model.init_args.policy.init_args.{setting.format(empty=tmp_path / 'empty')}",
                  tiny=setting.startswith("merge"))
    monkeypatch.delenv("LIT_AGENTS_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert message in err and "LIT_AGENTS_DEBUG=1 for the traceback" in err
    assert "Traceback" not in err and "Union subtypes" not in err and len(err.strip().splitlines()) <= 3, err
    monkeypatch.setenv("LIT_AGENTS_DEBUG", "1")
    with pytest.raises((ValueError, FileNotFoundError)) as raised:
        main(argv)
    assert message in str(raised.value)


def test_a_yaml_syntax_error_names_its_file(tmp_path, capsys):
    bad = tmp_path / "overlay.yaml"
    bad.write_text("trainer:\n  max_epochs: [1\n")
    with pytest.raises(SystemExit):
        main(["fit", "-c", str(ROOT / "quickstart_rl.yaml"), "-c", str(bad)])
    err = capsys.readouterr().err
    assert f"{bad} is not valid YAML" in err and f'in "{bad}", line 2, column 15' in err


def test_help_lists_every_subcommand_and_fit_help_has_clean_group_titles(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out.split("Available subcommands:")[1]
    for name in ("fit", "validate", "test", "predict", "quickstart", "multi2", "demos", "eval", "view"):
        assert f"\n    {name} " in listed, name
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert "<function" not in capsys.readouterr().out


# ----------------------------------------------------------------------------- settings that cannot train
def _adapter_b(run: Path) -> list:
    from safetensors.torch import load_file

    weights = load_file(run / "adapters" / "last" / "default" / "adapter_model.safetensors")
    return [w for name, w in weights.items() if "lora_B" in name]


def test_the_rl_debug_overlays_say_an_epoch_has_no_signal_and_always_update_trains(tmp_path, console, recwarn):
    """An untrained model scores 0 everywhere: short.yaml + short_rollouts.yaml never update, and say
    so in one line (not Lightning's `training_step` warning); always_update.yaml moves the weights."""
    main(rl_fit(tmp_path / "plain"))
    assert all(not b.any() for b in _adapter_b(tmp_path / "plain" / "quickstart_rl" / "version_0"))
    assert any(line.startswith("epoch 0: no learning signal in 4 rollouts (0 succeeded)") for line in console)
    assert not [w for w in recwarn if "returned `None`" in str(w.message)]

    main(rl_fit(tmp_path / "updates", "-c", str(DEBUG / "always_update.yaml")))
    assert all(b.any() for b in _adapter_b(tmp_path / "updates" / "quickstart_rl" / "version_0"))


@pytest.mark.parametrize(("settings", "message"), [
    (["--data.init_args.group_size=0"], "group_size and tasks_per_epoch must be at least 1"),
    (["--data.init_args.group_size=1"], "group_size: 1 cannot train GRPOPolicy: a group of one always scores alike"),
    (["--data.init_args.group_size=1", "--model.init_args.drop_zero_signal=false",
      "--model.init_args.error_baseline=false"], "its advantage (lit_agents.algorithms.grpo_advantages) "
                                                 "compares each rollout with the others of its group"),
], ids=["group_size 0", "group_size 1", "group_size 1 keeping every group"])
def test_a_group_size_that_cannot_train_fails_at_construction(tmp_path, settings, message):
    from lit_agents.cli import AgentsCLI

    with pytest.raises(ValueError) as raised:
        AgentsCLI(args=rl_fit(tmp_path, *settings)[1:], run=False)
    assert message in str(raised.value)
    # an advantage with a baseline of its own trains on groups of one
    AgentsCLI(args=rl_fit(tmp_path, "--data.init_args.group_size=1", "-c", str(DEBUG / "always_update.yaml"))[1:],
              run=False)


def test_an_adapter_of_another_base_model_is_named_before_peft_loads_it(tmp_path, capsys, tiny_config):
    """An adapter saved on a base of another width: one sentence naming both bases, for
    `lit-agents eval --adapter` and for `merge_adapter`, instead of peft's size mismatches."""
    from lit_agents.policy import AgentPolicy

    adapter = AgentPolicy(tiny=tiny_config, lora_r=4).save_role("default", tmp_path / "wide")  # width 64
    capsys.readouterr()
    narrow = ["-c", str(ROOT / "quickstart_rl.yaml"), "--model.init_args.policy.init_args.model=tiny",
              "-c", str(DEBUG / "tiny_model.yaml"), "--trainer.enable_progress_bar=false"]  # width 32
    with pytest.raises(SystemExit):
        main(["eval", *narrow, "--adapter", str(adapter), "--tasks", "1", "--out", str(tmp_path / "eval")])
    err = capsys.readouterr().err
    assert f"adapter {adapter} was trained on " in err and "but this config loads " in err
    assert "is (4, 64) in the adapter, a 32 -> " in err and len(err.strip().splitlines()) <= 3, err
    with pytest.raises(SystemExit):
        main(rl_fit(tmp_path, f"--model.init_args.policy.init_args.merge_adapter={adapter}"))
    assert f"adapter {adapter} was trained on " in capsys.readouterr().err


# ----------------------------------------------------------------------------- between start and end
def test_one_line_per_epoch_where_the_output_is_not_a_terminal(tmp_path, console, monkeypatch):
    main(rl_fit(tmp_path / "file", *UPDATES, "--trainer.max_epochs=2"))  # pytest's stdout: not a terminal
    lines = [line for line in console if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in lines] == ["epoch 0/1", "epoch 1/1"], lines
    assert all("rollout success 0.00, reward 0.00, loss " in line and ", val/success 0.00 (" in line for line in lines)
    console.clear()
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)  # a terminal: Lightning's progress bar's place
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    main(rl_fit(tmp_path / "terminal", *UPDATES, "--trainer.max_epochs=2"))
    assert not [line for line in console if line.startswith("epoch ")]


def test_third_party_progress_bars_follow_enable_progress_bar(tmp_path, capsys):
    """transformers' bars (loading the weights here) print only when the trainer's progress bar is on."""
    try:
        main(rl_fit(tmp_path / "off"))  # short.yaml: enable_progress_bar: false
        assert "Loading weights" not in capsys.readouterr().err
        main(rl_fit(tmp_path / "on", "--trainer.enable_progress_bar=true"))
        assert "Loading weights" in capsys.readouterr().err
    finally:
        from lit_agents.cli import _third_party_bars

        _third_party_bars(True)
