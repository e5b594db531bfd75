"""Every YAML in configs/ parses (``--print_config``) and fits one short epoch on the embedded default."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from lora_weights import set_lora_b

from lit_agents.cli import AgentsCLI, main

ROOT = Path(__file__).parents[1] / "configs"
# overlays (configs/scale/, configs/debug/, cpu.yaml, mosaic/broadcast.yaml) set no module: they stack on a config
OVERLAYS = sorted(c for c in ROOT.rglob("*.yaml") if "class_path: lit_agents.modules" not in c.read_text())
CONFIGS = sorted(c for c in ROOT.rglob("*.yaml") if c not in OVERLAYS)
# pipeline stages that load an earlier stage's adapters: `tests/test_multi2_pipeline.py` fits them
STAGED = {c for c in CONFIGS if "adapters:" in c.read_text()}
DEBUG = ROOT / "debug"


@pytest.fixture(scope="session")
def smollm2_folder(tmp_path_factory):
    """SmolLM2 dequantized once (`convert_gguf`) and cut to its first 2 of 30 layers: every SmolLM2
    config's short fit checks the wiring (its tokenizer, chat template, architecture, LoRA targets)
    in seconds instead of parsing the GGUF again and running the whole model (tests/test_models.py
    loads the real GGUF)."""
    pytest.importorskip("gguf")
    import shutil

    from transformers import AutoModelForCausalLM

    from lit_agents.models import convert_gguf

    full = Path(convert_gguf("smollm2-135m").path)
    model = AutoModelForCausalLM.from_pretrained(full)
    model.model.layers = model.model.layers[:2]
    model.config.num_hidden_layers = 2
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:2]
    out = tmp_path_factory.mktemp("smollm2_2_layers")
    model.save_pretrained(out)
    for name in full.iterdir():
        if name.name not in ("config.json", "model.safetensors"):
            shutil.copy(name, out / name.name)
    return str(out)


@pytest.fixture(scope="session")
def smollm2_adapter(smollm2_folder, tmp_path_factory):
    """A LoRA adapter of the 2-layer SmolLM2 (its B moved off 0): the `merge_adapter` of a config that
    starts from a LoRA SFT run."""
    from lit_agents.policy import AgentPolicy

    policy = AgentPolicy(model=smollm2_folder, lora_r=4, lora_targets="all-linear")
    set_lora_b(policy.model, value=0.01)
    return str(policy.save_role("default", tmp_path_factory.mktemp("smollm2_sft_adapter")))


def _short(config: Path, tmp_path: Path, smollm2: str | None = None, overlays: tuple[Path, ...] = (),
           merge: str | None = None) -> list[str]:
    """Any config shrunk to seconds by the configs/debug/ overlays (small model, few tasks, short
    episodes), writing under ``tmp_path``."""
    text = config.read_text()
    args = ["-c", str(config), *(a for o in overlays for a in ("-c", str(o))), "-c", str(DEBUG / "short.yaml")]
    if "RolloutDataModule" in text:
        args += ["-c", str(DEBUG / "short_rollouts.yaml")]
    if "DemonstrationDataModule" in text:
        args += ["-c", str(DEBUG / "short_demos.yaml")]
    if "model: runs/" in text:  # configs that start from an earlier stage's output: use the tiny default
        args += ["--model.init_args.policy.init_args.model=tiny"]
    if "model: tiny" in text or "model: runs/" in text:
        args += ["-c", str(DEBUG / "tiny_model.yaml")]
    if smollm2 and "model: smollm2-135m" in text:
        args += [f"--model.init_args.policy.init_args.model={smollm2}"]
    if merge:  # a config that merges an earlier LoRA stage's adapter
        args += [f"--model.init_args.policy.init_args.merge_adapter={merge}"]
    return [*args, f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}"]


def _id(config: Path) -> str:
    return str(config.relative_to(ROOT).with_suffix(""))


@pytest.mark.parametrize("config", CONFIGS, ids=map(_id, CONFIGS))
def test_config_prints(config, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "-c", str(config), "--print_config"])
    assert exit_.value.code == 0
    assert "class_path" in capsys.readouterr().out


@pytest.mark.parametrize("config", sorted(set(CONFIGS) - STAGED), ids=map(_id, sorted(set(CONFIGS) - STAGED)))
def test_config_fits_one_short_epoch(config, tmp_path, request):
    smollm2 = request.getfixturevalue("smollm2_folder") if "model: smollm2-135m" in config.read_text() else None
    merge = request.getfixturevalue("smollm2_adapter") if "merge_adapter:" in config.read_text() else None
    cli = AgentsCLI(args=_short(config, tmp_path, smollm2, merge=merge), run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.current_epoch == 1
    assert "val/success" in cli.trainer.callback_metrics


def test_broadcasting_is_an_overlay_of_each_mosaic_config(capsys):
    for mosaic in ("forking_mosaic", "compaction_mosaic"):
        with pytest.raises(SystemExit):
            main(["fit", "-c", str(ROOT / "mosaic" / f"{mosaic}.yaml"), "-c", str(ROOT / "mosaic" / "broadcast.yaml"),
                  "--print_config"])
        out = capsys.readouterr().out
        assert "trajectory_term: false" in out and "session_term: false" in out and "name: mosaic_broadcast" in out


def test_broadcasting_fits_one_short_epoch(tmp_path):
    cli = AgentsCLI(args=_short(ROOT / "mosaic" / "forking_mosaic.yaml", tmp_path,
                                overlays=(ROOT / "mosaic" / "broadcast.yaml",)), run=False)
    assert not cli.model.hparams.trajectory_term and not cli.model.hparams.session_term
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.current_epoch == 1


def test_the_smollm2_overlay_fits_a_mosaic_config_from_a_lora_sft(tmp_path, smollm2_folder, smollm2_adapter):
    """configs/mosaic/smollm2.yaml stacked on a Mosaic config: SmolLM2 with the SFT adapter merged,
    the quick start's SmolLM2 RL recipe, one short epoch."""
    mosaic = ROOT / "mosaic"
    args = ["-c", str(mosaic / "forking_mosaic.yaml"), "-c", str(mosaic / "smollm2.yaml"),
            "-c", str(mosaic / "broadcast.yaml"),
            "-c", str(DEBUG / "short.yaml"), "-c", str(DEBUG / "short_rollouts.yaml"),
            f"--model.init_args.policy.init_args.model={smollm2_folder}",
            f"--model.init_args.policy.init_args.merge_adapter={smollm2_adapter}",
            f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    cli = AgentsCLI(args=args, run=False)
    hp = cli.model.hparams
    assert (hp.kl_estimator, hp.lr, hp.trajectory_term) == ("k3_clamp", 5e-4, False)
    assert cli.datamodule.agent.temperature == 1.0 and cli.datamodule.rollout_chunk == 8
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.current_epoch == 1 and "val/success" in cli.trainer.callback_metrics


def test_library_defaults_live_in_the_cli_not_in_every_config(capsys):
    """One device, clipping at 1 and TensorBoard under runs/ come from `AgentsCLI`; configs name
    their run only, and configs/cpu.yaml forces the CPU."""
    for config in CONFIGS:
        text = config.read_text()
        assert "TensorBoardLogger" not in text and "accelerator:" not in text and "gradient_clip_val: 1.0" not in text
    with pytest.raises(SystemExit):
        main(["fit", "-c", str(ROOT / "quickstart_rl.yaml"), "-c", str(ROOT / "cpu.yaml"), "--print_config"])
    out = capsys.readouterr().out
    for line in ("accelerator: cpu", "devices: 1", "gradient_clip_val: 1.0", "save_dir: runs", "name: quickstart_rl"):
        assert line in out


def test_unknown_key_is_an_error(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "-c", str(CONFIGS[0]), "--model.init_args.no_such_key=1", "--print_config"])
    assert "no_such_key" in capsys.readouterr().err


def test_help_names_the_library_commands(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(command in out for command in ("fit", "quickstart", "multi2", "demos", "eval", "view"))


def test_the_entry_point_prints_no_lightning_args_warning():
    """Lightning's warning against passing both sys.argv and ``args`` does not reach users: the
    pipelines pass their stages' arguments while sys.argv holds their own command line."""
    out = subprocess.run([sys.executable, "-c", "from lit_agents.cli import main; main(['fit', '-c', "
                          f"'{CONFIGS[0]}', '--print_config'])", "fit", "-c", str(CONFIGS[0])],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "args parameter" not in out.stderr


def test_pipelines_find_the_configs_outside_a_clone(tmp_path, monkeypatch):
    """`lit-agents quickstart` and `multi2` run from any directory: ./configs when there is one,
    else the installed configs (here: the clone's, as `pip install -e` installs it)."""
    from lit_agents.pipelines import default_config_dir

    monkeypatch.chdir(tmp_path)
    assert default_config_dir() == ROOT and default_config_dir("multi2") == ROOT / "multi2"
    (tmp_path / "configs" / "multi2").mkdir(parents=True)
    assert default_config_dir("multi2") == Path("configs/multi2")  # your own copy wins


def test_the_wheel_packages_every_config_folder():
    import tomllib

    setup = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {f"lit_agents.configs.{p.name}" for p in ROOT.iterdir() if p.is_dir()}
    assert folders <= set(setup["packages"]) and "lit_agents.configs" in setup["packages"]
    assert setup["package-dir"]["lit_agents.configs"] == "configs" and "*.yaml" in setup["package-data"]["*"]


def test_a_short_fit_shows_no_third_party_noise(tmp_path, recwarn, console):
    """The warnings and the advertisement every run printed, which say nothing about the run, are
    gone; Lightning's own console lines still show."""
    cli = AgentsCLI(args=_short(ROOT / "quickstart_rl.yaml", tmp_path), run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    warned = [str(w.message) for w in recwarn]
    for noise in ("is_gradient_checkpointing", "isinstance(treespec, LeafSpec)", "`IterableDataset` has `__len__`"):
        assert not any(noise in message for message in warned), noise
    assert not any("litlogger" in message for message in console)
    assert any("`Trainer.fit` stopped" in message for message in console)


def test_the_bitsandbytes_cpu_kernel_notice_is_dropped_around_peft_only(caplog):
    from lit_agents.policy import _quiet_peft_and_bnb

    notice = "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure ..."
    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING, logger=bnb.name):
        with _quiet_peft_and_bnb():
            bnb.warning(notice, "no kernels")
            bnb.warning("another bitsandbytes warning")
        bnb.warning(notice, "outside")
    assert [r.getMessage()[:40] for r in caplog.records] == ["another bitsandbytes warning",
                                                             "Failed to load CPU gemm_4bit_forward fro"]


def test_the_data_seed_follows_seed_everything(tmp_path):
    """`--seed_everything=S` alone gives the data module seed S (its own tasks and sampling seeds),
    quietly; a data seed set apart from it is kept, and the fit says it differs."""
    args = _short(ROOT / "quickstart_rl.yaml", tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = AgentsCLI(args=[*args, "--seed_everything=3"], run=False)
    assert cli.datamodule.seed == 3
    assert not [w for w in caught if "sampling seeds follow" in str(w.message)]
    first = [t.task_id for t in cli.datamodule.held_out_tasks()]
    with pytest.warns(UserWarning, match="data.init_args.seed=0"):
        cli = AgentsCLI(args=[*args, "--seed_everything=3", "--data.init_args.seed=0"], run=False)
    assert cli.datamodule.seed == 0
    assert [t.task_id for t in cli.datamodule.held_out_tasks()] != first


def test_a_cpu_run_on_a_gpu_machine_keeps_fp32_weights(tmp_path, monkeypatch):
    """`dtype: auto` is bf16 wherever CUDA is visible; `--trainer.accelerator=cpu` (configs/cpu.yaml)
    there must not put bf16 weights on the CPU. Without a GPU, or on the GPU, `auto` stays."""

    class ParseOnly(AgentsCLI):  # the config as the CLI hands it on; a mocked GPU cannot build models
        def instantiate_classes(self) -> None:
            pass

    args = _short(ROOT / "quickstart_rl.yaml", tmp_path)
    cpu = [*args, "-c", str(ROOT / "cpu.yaml")]
    assert ParseOnly(args=cpu, run=False).config.model.init_args.policy.init_args.dtype == "auto"  # no GPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the same configs on a GPU machine
    assert ParseOnly(args=cpu, run=False).config.model.init_args.policy.init_args.dtype == "float32"
    assert ParseOnly(args=args, run=False).config.model.init_args.policy.init_args.dtype == "auto"
