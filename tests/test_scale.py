"""Scale and reliability: DDP on CPU (gloo), resume after a kill, determinism."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).parent / "scripts"


def _script_env(**extra: str) -> dict[str, str]:
    """The caller's environment with one OpenMP thread and the scripts' folder ahead of its own
    PYTHONPATH (packages installed there must stay importable)."""
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def run_script(args: list[str], cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    """Run a script in its own process group; on timeout kill the whole group (DDP children too)."""
    env = _script_env(HANG_DUMP_S=str(timeout - 20))
    proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{args} timed out:\n{out[-4000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


@pytest.mark.parametrize("kind", ["grpo", "sft", "actor_critic", "grpo_fsdp", "grpo_full_fsdp"])
def test_ddp_two_cpu_processes_stay_in_sync(kind, tmp_path):
    """2 ranks (gloo): each rolls out its own tasks, both end with identical trainable weights
    after the same number of steps, even when one rank has fewer batches (pad steps). Under FSDP
    (Lightning's FSDPStrategy on CPU processes, FULL_SHARD; LoRA with the base as KL reference, or
    every weight with a snapshot) rollouts, the KL reference and the save run on whole parameters,
    and the saved adapter or model holds the trained tensors."""
    done = run_script([str(SCRIPTS / "ddp_fit.py"), str(tmp_path), kind], cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    assert ranks[0]["sums"].keys() == ranks[1]["sums"].keys() and ranks[0]["sums"]
    for name, value in ranks[0]["sums"].items():
        assert ranks[1]["sums"][name] == pytest.approx(value, rel=1e-6, abs=1e-8), name
    if kind.startswith("grpo"):
        for epoch0, epoch1 in zip(ranks[0]["tasks"], ranks[1]["tasks"]):
            assert epoch0 and epoch1 and not set(epoch0) & set(epoch1)  # distinct tasks per rank
        assert ranks[0]["pad_steps"] + ranks[1]["pad_steps"] > 0  # unequal batch counts happened
        assert ranks[0]["kl"] > 0 and ranks[1]["kl"] > 0  # KLAnchor ran (each rank's own rows)
    if kind == "grpo_full_fsdp":  # the whole model, gathered, as a loadable checkpoint
        from safetensors.torch import load_file

        saved = load_file(next((tmp_path / "adapters" / "last" / "model").glob("*.safetensors")))
        trained = {name.removeprefix("policy.model."): value for name, value in ranks[0]["sums"].items()}
        for name, tensor in saved.items():
            if name in trained:
                assert float(tensor.double().sum()) == pytest.approx(trained[name], rel=1e-5, abs=1e-6), name
        assert len(saved.keys() & trained.keys()) >= len(trained) - 1  # an output layer tied to the embedding
        return
    role = "executor" if kind == "actor_critic" else "default"
    assert (tmp_path / "adapters" / "last" / role / "adapter_config.json").exists()
    if role == "default":  # the adapter file holds the trained tensors, whole
        from safetensors.torch import load_file

        saved = load_file(tmp_path / "adapters" / "last" / role / "adapter_model.safetensors")
        trained = {name.removeprefix("policy.model.").replace(".default.", "."): value
                   for name, value in ranks[0]["sums"].items() if "lora_" in name}
        assert saved.keys() == trained.keys()
        for name, tensor in saved.items():
            assert float(tensor.double().sum()) == pytest.approx(trained[name], rel=1e-6, abs=1e-8), name


def test_a_ddp_step_is_one_token_mean_over_every_ranks_tokens(tmp_path):
    """2 ranks holding 60 and 4 trained tokens: the step's gradient (after DDP's average) equals
    the gradient of one process over all 64 tokens, not the mean of the two ranks' token means
    (which would give rank 1's 4 tokens the weight of rank 0's 60)."""
    for devices in (2, 1):
        done = run_script([str(SCRIPTS / "ddp_grad.py"), str(tmp_path), str(devices)], cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-4000:]
    ddp, single = (torch.load(tmp_path / f"grad{d}.pt") for d in (2, 1))
    assert ddp.keys() == single.keys() and ddp
    assert any(g.abs().sum() > 0 for g in single.values())
    for name, grad in single.items():
        torch.testing.assert_close(ddp[name], grad, rtol=1e-4, atol=1e-7, msg=name)


def _fit_args(save_dir: Path, epochs: int = 3) -> list[str]:
    """The quick start's RL stage on the toy model, on the overlay that updates every epoch
    (configs/debug/always_update.yaml), with the library's LoRA dropout (0.05): the weights a
    resume must reproduce depend on the dropout masks, so on the restored random state."""
    configs = Path(__file__).parents[1] / "configs"
    overlays = [configs / "quickstart_rl.yaml", *(configs / "debug" / f"{name}.yaml" for name in
                                                  ("short", "short_rollouts", "tiny_model", "always_update"))]
    return ["-m", "lit_agents.cli", "fit", *(arg for path in overlays for arg in ("-c", str(path))),
            f"--trainer.max_epochs={epochs}", "--trainer.limit_train_batches=null",
            "--trainer.check_val_every_n_epoch=100", f"--trainer.default_root_dir={save_dir}",
            f"--trainer.logger.init_args.save_dir={save_dir}", "--model.init_args.policy.init_args.model=tiny",
            "--model.init_args.policy.init_args.lora_dropout=0.05", "--model.init_args.lr=1e-2",
            "--data.init_args.max_tokens_per_batch=200"]


def _adapter(save_dir: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(save_dir.glob("quickstart_rl/version_*/adapters/last/default/adapter_model.safetensors"))
    assert len(files) == 1, files
    return load_file(files[0])


def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path):
    """SIGKILL a run during its third epoch, resume it with `--ckpt_path last`: it continues in
    the same log folder from the last epoch's checkpoint (written atomically) and ends with the
    same adapter weights and the same saved rollouts as a run that was never interrupted: no
    epoch is played twice (Lightning asks for the finished epoch's loader first), a file the
    killed run left half-written is replaced, and the dropout masks after the resume are the
    uninterrupted run's (the random state is restored)."""
    import time

    whole = run_script(_fit_args(tmp_path / "whole"), cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout[-4000:]

    killed_dir = tmp_path / "killed"
    env = _script_env()
    proc = subprocess.Popen([sys.executable, *_fit_args(killed_dir)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    checkpoints = killed_dir / "quickstart_rl" / "version_0" / "checkpoints"
    deadline = time.time() + 300

    def second_epoch_saved() -> bool:  # its own checkpoint, then last.ckpt after it
        done = list(checkpoints.glob("epoch=1-*.ckpt"))
        last = checkpoints / "last.ckpt"
        return bool(done) and last.exists() and last.stat().st_mtime_ns >= done[0].stat().st_mtime_ns

    while not second_epoch_saved() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (checkpoints / "last.ckpt").exists() and not list(checkpoints.glob("epoch=2-*.ckpt")), "killed too late"

    resumed = run_script([*_fit_args(killed_dir), "--ckpt_path", "last"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "last.ckpt at epoch 2 (step 8)" in resumed.stdout  # two epochs of four optimizer steps done
    assert not (killed_dir / "quickstart_rl" / "version_1").exists()  # same run folder
    want, got = _adapter(tmp_path / "whole"), _adapter(killed_dir)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
    assert any("lora_B" in name and want[name].abs().sum() > 0 for name in want)  # it did train
    rollouts = {name: sorted((name / "quickstart_rl" / "version_0" / "rollouts").glob("train-*.jsonl"))
                for name in (tmp_path / "whole", killed_dir)}
    assert [f.name for f in rollouts[killed_dir]] == [f.name for f in rollouts[tmp_path / "whole"]]
    assert len(rollouts[killed_dir]) == 3
    for whole_file, resumed_file in zip(rollouts[tmp_path / "whole"], rollouts[killed_dir]):
        lines = resumed_file.read_text().splitlines()
        assert len(lines) == 4, resumed_file.name  # 2 tasks x 2 attempts, once
        assert list(map(json.loads, lines)) == list(map(json.loads, whole_file.read_text().splitlines()))


def test_corrupt_and_mismatched_checkpoints_name_the_file(tmp_path, monkeypatch):
    from lit_agents.cli import AgentsCLI

    def cli(save_dir: Path, *extra: str) -> AgentsCLI:
        return AgentsCLI(args=[*_fit_args(save_dir, epochs=1)[3:], *extra], run=False)

    first = cli(tmp_path / "a")
    first.trainer.fit(first.model, datamodule=first.datamodule)
    good = next((tmp_path / "a").glob("quickstart_rl/version_0/checkpoints/last.ckpt"))

    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # a half-written file
    second = cli(tmp_path / "b")
    with pytest.raises(RuntimeError, match="bad.ckpt"):
        second.trainer.fit(second.model, datamodule=second.datamodule, ckpt_path=str(bad))

    other = cli(tmp_path / "c", "--model.init_args.policy.init_args.lora_r=4")  # the config says 32
    with pytest.raises(ValueError, match=r"last\.ckpt does not match .*shape mismatch"):
        other.trainer.fit(other.model, datamodule=other.datamodule, ckpt_path=str(good))


@pytest.mark.parametrize("overlay", sorted((Path(__file__).parents[1] / "configs" / "scale").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_strategy_overlays_parse(overlay, capsys):
    from lit_agents.cli import main

    base = Path(__file__).parents[1] / "configs" / "quickstart_rl.yaml"
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "-c", str(base), "-c", str(overlay), "--print_config"])
    assert exit_.value.code == 0
    printed = capsys.readouterr().out
    assert "strategy:" in printed and "AtomicCheckpointIO" in printed and "save_last: true" in printed


def test_full_parameters_is_a_no_op_where_nothing_is_sharded():
    """``lit-agents eval`` plays under an FSDP config with a trainer that never fits: the
    strategy holds no model, or one without FSDP modules, so there is nothing to gather."""
    import contextlib
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from lit_agents.strategies import full_parameters

    fsdp = FSDPStrategy()
    assert isinstance(full_parameters(SimpleNamespace(strategy=fsdp)), contextlib.nullcontext)
    fsdp.model = torch.nn.Linear(2, 2)
    assert isinstance(full_parameters(SimpleNamespace(strategy=fsdp)), contextlib.nullcontext)
    assert isinstance(full_parameters(SimpleNamespace(strategy=DDPStrategy())), contextlib.nullcontext)
    assert isinstance(full_parameters(None), contextlib.nullcontext)


def test_actor_critic_names_its_fsdp_limit(tiny_config, monkeypatch):
    """Manual optimization under FSDP fails deep inside FSDP's backward hooks; System2ActorCritic
    says why before the model is wrapped."""
    from lightning.pytorch import Trainer

    from lit_agents.modules import System2ActorCritic
    from lit_agents.policy import AgentPolicy

    monkeypatch.syspath_prepend(str(SCRIPTS))
    from ddp_fit import CPUFSDPStrategy

    module = System2ActorCritic(AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4), phase="offline")
    module.trainer = Trainer(accelerator="cpu", devices=1, strategy=CPUFSDPStrategy(), logger=False)
    with pytest.raises(ValueError, match="FSDP.*19685.*DDP"):
        module.setup("fit")
