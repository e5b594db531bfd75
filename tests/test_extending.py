"""Bring your own model, environment and advantage function, and subclass the extension points,
each run through ``lit-agents fit`` (`AgentsCLI(args=[...])`: what `lit_agents.cli.main` runs,
keeping the trainer to inspect).

The models are built here with random weights (hidden 32, 2 layers) and a byte-level BPE
tokenizer trained offline on a few lines: nothing downloads. Name resolution and a real
pretrained GGUF are tests/test_models.py's; packed log-probs per architecture tests/test_policy.py's.
The examples live in examples/ (docs/extending.md), put on ``sys.path`` as a user's package would be.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from lit_agents.cli import AgentsCLI, main
from lit_agents.policy import AgentPolicy
from lit_agents.types import Call, Rollout, Session

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"
SYSTEM = "Be brief."

# ----------------------------------------------------------------------------- your own model
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MISTRAL = (  # like Mistral's own: no system role (the policy folds it into the first user message)
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('Conversation roles must be user or assistant') }}"
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


@dataclass(frozen=True)
class Arch:
    """A Hugging Face architecture and a tokenizer in its family's style."""

    config: type
    model: type
    eos: str
    specials: tuple[str, ...]  # every special token (eos, bos, pad and the template's markers)
    bos: str | None = None
    pad: str | None = None
    template: str | None = None  # None: the policy's fallback template (`role: text<eos>`)
    first_prompt: str = ""  # the first prompt the template renders, for {system} and {user}
    lora_targets: tuple[str, ...] = ("k_proj", "o_proj", "q_proj", "v_proj")


ARCHS = {
    "llama": Arch(LlamaConfig, LlamaForCausalLM, "<|eot_id|>",
                  ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                  bos="<|begin_of_text|>", template=LLAMA3,
                  first_prompt="<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
                               "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>"
                               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "qwen2": Arch(Qwen2Config, Qwen2ForCausalLM, "<|im_end|>", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                  pad="<|endoftext|>", template=CHATML,
                  first_prompt="<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                               "<|im_start|>assistant\n"),
    "mistral": Arch(MistralConfig, MistralForCausalLM, "</s>", ("<s>", "</s>", "[INST]", "[/INST]"), bos="<s>",
                    template=MISTRAL, first_prompt="<s>[INST] {system}\n\n{user} [/INST]"),
    "gpt2": Arch(GPT2Config, GPT2LMHeadModel, "<|endoftext|>", ("<|endoftext|>",), bos="<|endoftext|>",
                 first_prompt="system: {system}<|endoftext|>\nuser: {user}<|endoftext|>\nassistant: ",
                 lora_targets=("c_attn",)),
}
CORPUS = ["Goal: craft 1 oak planks. Crafting commands: craft 4 oak planks using 1 oak log.",
          "Inventory: [oak log] (1). Got 1 oak log. Could not find a valid recipe for that item.",
          "I am thinking of a whole number. guess 16. 16: higher. 24: lower. 20 is right!", SYSTEM]


def build_checkpoint(arch: str, folder: Path) -> Path:
    """A random-weight model of ``arch`` and its tokenizer, saved like any HF checkpoint."""
    spec = ARCHS[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=list(spec.specials),
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    named = {spec.eos, spec.bos, spec.pad}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=spec.eos, bos_token=spec.bos, pad_token=spec.pad,
        additional_special_tokens=[t for t in spec.specials if t not in named],
        chat_template=spec.template, clean_up_tokenization_spaces=False,
    )
    ids = dict(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    if spec.model is GPT2LMHeadModel:
        config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=1024, **ids)
    else:
        config = spec.config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=1024, **ids)
    torch.manual_seed(0)
    spec.model(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# the shortest fit: one epoch of 2 tasks x 2 attempts of 2 steps, no validation
SHORT = [
    "--trainer.max_epochs=1",
    "--trainer.limit_val_batches=0",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--data.init_args.tasks_per_epoch=2",
    "--data.init_args.group_size=2",
    "--data.init_args.val_tasks=1",
    "--data.init_args.agent.init_args.max_new_tokens=4",
    "--data.init_args.agent.init_args.max_steps=2",
    "--model.init_args.policy.init_args.lora_r=4",
]


def fit(args: list[str], tmp_path: Path) -> AgentsCLI:
    """``lit-agents fit <args>``, shortened, writing under ``tmp_path``."""
    out = tmp_path / "runs"
    return AgentsCLI(args=["fit", *args, *SHORT, f"--trainer.default_root_dir={out}",
                           f"--trainer.logger.init_args.save_dir={out}"])


def assert_trained(cli: AgentsCLI) -> Path:
    """An optimizer step ran, the loss was logged, a resumable checkpoint and the adapter were
    written; returns the adapter's folder."""
    trainer = cli.trainer
    assert trainer.current_epoch == 1 and trainer.global_step >= 1
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    log_dir = Path(trainer.log_dir)
    assert (log_dir / "checkpoints" / "last.ckpt").is_file()
    adapter = log_dir / "adapters" / "last" / "default"
    assert (adapter / "adapter_model.safetensors").is_file()
    return adapter


@pytest.mark.parametrize("arch", list(ARCHS))
def test_your_own_checkpoint_trains_with_its_chat_template(arch, tmp_path):
    """configs/quickstart_rl.yaml on a local checkpoint of each architecture: LoRA on its
    attention projections, prompts in its chat template, stops at its end-of-turn token."""
    spec = ARCHS[arch]
    folder = build_checkpoint(arch, tmp_path / arch)
    overlay = tmp_path / "byo.yaml"  # `lora_targets: null` (the default) is a YAML value, not a CLI flag
    overlay.write_text(json.dumps({"model": {"init_args": {
        "policy": {"init_args": {"model": str(folder), "lora_targets": None}},
        "drop_zero_signal": False}}}))
    cli = fit(["-c", str(ROOT / "configs" / "quickstart_rl.yaml"), "-c", str(overlay),
               f"--data.init_args.agent.init_args.system_prompt={SYSTEM}"], tmp_path)

    adapter = assert_trained(cli)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == sorted(spec.lora_targets)
    policy = cli.model.policy
    assert type(policy.model.get_base_model()) is spec.model
    assert policy.chat.stop_ids == (policy.tokenizer.convert_tokens_to_ids(spec.eos),)
    for rollout in cli.datamodule.last_rollouts:
        first = rollout.sessions[0].calls[0]
        want = spec.first_prompt.format(system=SYSTEM, user=first.prompt_text)
        assert policy.tokenizer.decode(first.prompt_ids) == want


# ----------------------------------------------------------------------------- examples
@pytest.fixture()
def examples(monkeypatch):
    """examples/ importable, as a user's own package is (``PYTHONPATH=examples`` on the command line)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory) -> Path:
    return build_checkpoint("qwen2", tmp_path_factory.mktemp("qwen2"))


@pytest.fixture(scope="module")
def policy(qwen2) -> AgentPolicy:
    return AgentPolicy(str(qwen2), lora_r=4)


def guess_number_args(qwen2: Path, *more: str) -> list[str]:
    """examples/guess_number.yaml on the small local model (the YAML's `model: tiny` builds the
    embedded default: ~8 s more) with a LoRA adapter, as on a pretrained model, with every group
    kept so each run takes a step."""
    # a class flag first: jsonargparse would drop the nested values given before it
    return ["-c", str(EXAMPLES / "guess_number.yaml"), *more, f"--model.init_args.policy.init_args.model={qwen2}",
            "--model.init_args.policy.init_args.finetune=lora", "--model.init_args.policy.init_args.lora_r=16",
            "--model.init_args.policy.init_args.lora_targets=all-linear", "--model.init_args.drop_zero_signal=false"]


def spy(owner, name: str, monkeypatch) -> list:
    """Replace ``owner.name`` by a wrapper recording ``(args, result)`` of every call."""
    calls, original = [], getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append((args, result))
        return result

    monkeypatch.setattr(owner, name, wrapper)
    return calls


@pytest.mark.parametrize("config", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_example_configs_print(config, examples, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "-c", str(config), "--print_config"])
    assert exit_.value.code == 0 and "class_path" in capsys.readouterr().out


def test_your_environment_and_advantage_function(examples, qwen2, tmp_path, monkeypatch):
    import guess_number

    calls = spy(guess_number, "mean_baseline_advantages", monkeypatch)  # before the YAML names it
    cli = fit(guess_number_args(qwen2), tmp_path)
    assert_trained(cli)
    assert isinstance(cli.datamodule.env, guess_number.GuessNumber)
    rollouts = cli.datamodule.last_rollouts
    assert len(rollouts) == 4 and len(calls) == 1  # one call per epoch, on all its rollouts
    (rewards, groups), advantages = calls[0]
    assert rewards.tolist() == pytest.approx([r.reward for r in rollouts])
    assert groups.tolist() == [r.group_id for r in rollouts]
    assert advantages.tolist() == pytest.approx((rewards - rewards.view(2, 2).mean(1).repeat_interleave(2)).tolist())


def test_guess_number_env(examples):
    from guess_number import GuessNumber

    from lit_agents.envs import play_expert

    env = GuessNumber(high=32, train_tasks=8, test_tasks=4, shaping=0.5)
    ids = {split: {t.task_id for t in env.tasks(split)} for split in ("train", "val", "test")}
    assert sum(map(len, ids.values())) == 16 and len(set.union(*ids.values())) == 16
    assert env.tasks("test") == GuessNumber(high=32, train_tasks=8, test_tasks=4).tasks("test")
    for task in env.tasks("test"):  # binary search finds any of 32 numbers in 6 guesses
        _, steps, success = play_expert(env, task)
        assert success and len(steps) <= 6
        assert sum(r.reward for _, r in steps) == pytest.approx(1.5)  # 1 + shaping, whatever the path
    state, _ = env.reset(env.tasks("train")[0])
    state.target = 20
    assert "error" in env.step(state, "think first").info
    result = env.step(state, "guess 8")  # rules out 1..8: 8 of the 31 steps of the range
    assert result.observation == "8: higher." and result.reward == pytest.approx(0.5 * 8 / 31)
    assert env.step(state, "I say 25").observation == "25: lower." and env.progress(state) == pytest.approx(1 - 15 / 31)


def test_mean_baseline_advantages_by_hand(examples):
    from guess_number import mean_baseline_advantages

    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 0.25, 0.75])
    groups = torch.tensor([3, 3, 7, 7, 9, 5, 5])
    want = [0.5, -0.5, 0.0, 0.0, 0.0, -0.25, 0.25]
    assert mean_baseline_advantages(rewards, groups).tolist() == pytest.approx(want)
    assert mean_baseline_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).numel() == 0


# ----------------------------------------------------------------------------- subclasses
def _rollout(group: int, reward: float, generated: int, steps: int) -> Rollout:
    call = Call(prompt_ids=[1, 2], completion_ids=[3] * generated, logprobs=[-0.5] * generated)
    return Rollout("t", group, [Session(calls=[call])], reward=reward, meta={"steps": steps})


def test_step_cost_rewards_by_hand(examples, policy):
    from subclasses import StepCostGRPO

    module = StepCostGRPO(policy, step_cost=0.1)
    rollouts = [_rollout(0, 1.0, 4, 2), _rollout(0, 1.0, 4, 5)]
    assert module.rollout_rewards(rollouts).tolist() == pytest.approx([0.8, 0.5])
    # equal env rewards, unequal shaped ones: GRPO now prefers the shorter success
    assert module.rollout_advantages(rollouts).tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)
    assert len(module.rollouts_to_rows(rollouts)) == 2  # the group has a signal now


def test_sequence_mean_advantages_by_hand(examples, policy):
    from subclasses import SequenceMeanGRPO

    rollouts = [_rollout(0, 1.0, 2, 1), _rollout(0, 0.0, 6, 1)]
    # GRPO: rewards [1, 0] -> [0.7071, -0.7071]; x mean tokens 4 / tokens [2, 6]
    advantages = SequenceMeanGRPO(policy).rollout_advantages(rollouts)
    assert advantages.tolist() == pytest.approx([1.4142, -0.4714], abs=1e-4)


def test_dual_clip_loss_by_hand(examples, policy):
    from subclasses import DualClipPPO

    from lit_agents.modules import GRPOPolicy

    module = DualClipPPO(policy, dual_clip=3.0)
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[5.0, 0.5, 1.0]])).requires_grad_()
    adv, mask = torch.tensor([[-1.0, 1.0, -1.0]]), torch.ones(1, 3, dtype=torch.bool)
    out = module.policy_loss(logp, old, adv, mask)
    # ratio 5, A=-1: PPO max(5, 1.28) = 5, capped at 3; ratio 0.5, A=1: max(-0.5, -0.8); ratio 1, A=-1: 1
    assert out.loss.item() == pytest.approx((3.0 - 0.5 + 1.0) / 3)
    assert out.stats["dual_clip_frac"].item() == pytest.approx(1 / 3)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert grad[0, 0] == 0  # the capped token no longer pushes
    ppo = GRPOPolicy(policy).policy_loss(logp, old, adv, mask)
    assert ppo.loss.item() == pytest.approx((5.0 - 0.5 + 1.0) / 3)
    with pytest.raises(ValueError, match="PPO loss"):
        DualClipPPO(policy, loss="cispo")


def test_thought_action_format_and_demonstrations(examples, policy):
    from guess_number import GuessNumber
    from subclasses import ThoughtActionAgent

    agent = ThoughtActionAgent()
    assert agent.parse_action("low is 1, high 32.\nAction: guess 16\nmore") == "guess 16"
    assert agent.parse_action("guess 3") == "guess 3"  # no marker: the env judges the whole text
    env = GuessNumber()
    rollout = agent.expert_rollout(policy, env, env.tasks("train")[0])
    calls = rollout.sessions[0].calls
    assert rollout.success and calls[0].completion_text == "Action: guess 16"
    assert calls[0].completion_ids == policy.chat.completion("Action: guess 16")
    assert "end your reply with `Action: <your action>`" in policy.tokenizer.decode(calls[0].prompt_ids)
    assert all(agent.parse_action(c.completion_text).startswith("guess ") for c in calls)


@pytest.mark.parametrize(("flag", "owner", "hook"), [
    ("--model.class_path=subclasses.StepCostGRPO", "StepCostGRPO", "rollout_rewards"),
    ("--model.class_path=subclasses.SequenceMeanGRPO", "SequenceMeanGRPO", "rollout_advantages"),
    ("--model.class_path=subclasses.DualClipPPO", "DualClipPPO", "policy_loss"),
    ("--data.init_args.agent.class_path=subclasses.ThoughtActionAgent", "ThoughtActionAgent", "parse_action"),
], ids=["rewards", "advantages", "loss", "agent"])
def test_subclass_hooks_run_in_fit(flag, owner, hook, examples, qwen2, tmp_path, monkeypatch):
    """Each example class swapped into examples/guess_number.yaml from the command line: its
    overriding method is what the fit calls."""
    import subclasses

    cls = getattr(subclasses, owner)
    calls = spy(cls, hook, monkeypatch)
    cli = fit(guess_number_args(qwen2, flag), tmp_path)
    assert_trained(cli)
    assert type(cli.model) is cls or type(cli.datamodule.agent) is cls
    assert calls, f"{owner}.{hook} was not called"
    if hook == "policy_loss":
        assert "diag/dual_clip_frac" in cli.trainer.callback_metrics
    if hook == "parse_action":  # every action of every episode went through it, after its system text
        assert len(calls) == sum(r.num_turns for r in cli.datamodule.last_rollouts)
        first = cli.datamodule.last_rollouts[0].sessions[0].calls[0]
        assert "`Action: <your action>`" in cli.model.policy.tokenizer.decode(first.prompt_ids)


# ----------------------------------------------------------------------------- subclasses: the other modules and loops
CONFIGS = ROOT / "configs"
# the embedded default at its smallest (hidden 32, one layer): built once per test session
TINY = ["-c", str(CONFIGS / "debug" / "tiny_model.yaml")]
QUICK = ["--trainer.max_epochs=1", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--data.init_args.val_tasks=1"]
# RolloutDataModule: 2 tasks x 2 attempts, short turns
ROLLOUTS = ["--data.init_args.tasks_per_epoch=2", "--data.init_args.group_size=2",
            "--data.init_args.agent.init_args.max_new_tokens=4"]


def fit_config(config: str, tmp_path: Path, *args: str, overlay: dict | None = None) -> AgentsCLI:
    """``lit-agents fit -c configs/<config> [-c overlay.yaml] <args>`` (a class flag first): one epoch without
    validation on the smallest embedded default (a config that starts from an earlier stage's
    model gets it too), writing under ``tmp_path``."""
    out, more = tmp_path / "runs", []
    if overlay is not None:  # `null` values (no adapters to load) are YAML, not flags
        (tmp_path / "overlay.yaml").write_text(json.dumps(overlay))
        more = ["-c", str(tmp_path / "overlay.yaml")]
    # a class flag first: jsonargparse would drop the nested `tiny` values given before it
    return AgentsCLI(
        args=[
            "fit",
            "-c",
            str(CONFIGS / config),
            *more,
            *args,
            "--model.init_args.policy.init_args.model=tiny",
            *TINY,
            *QUICK,
            f"--trainer.default_root_dir={out}",
            f"--trainer.logger.init_args.save_dir={out}",
        ]
    )


def _node(sid: int, parent: int | None, depth: int, ok: bool, steps: int) -> Session:
    call = Call([1, 2], [3, 4], [-0.1, -0.1])
    return Session(sid, "main" if parent is None else "subagent", parent, depth, [call],
                   success=ok, meta={"steps": steps})


def _session(sid: int, kind: str, before: float, after: float) -> Session:
    call = Call([1, 2, 3], [4, 5], [-0.1, -0.2])
    return Session(sid, kind, None, 0, [call], progress_before=before, progress_after=after)


def test_successful_demos_sft_in_fit(examples, tmp_path, monkeypatch):
    """configs/quickstart.yaml on a demonstrations file of your own (``path:``) in which two of
    four episodes failed: `SuccessfulDemosSFT.demonstration_rows` makes the rows, of the two
    successes only."""
    import subclasses

    from lit_agents.data.demos import read_episodes, write_episodes

    demos = tmp_path / "demos.jsonl"
    main(["demos", "-c", str(CONFIGS / "quickstart.yaml"), "--limit", "4", "--out", str(demos)])
    episodes = read_episodes(demos)
    for episode in episodes[1::2]:  # your agent's failures: stopped after one action
        episode.steps, episode.success = episode.steps[:1], False
    write_episodes(episodes, demos)
    calls = spy(subclasses.SuccessfulDemosSFT, "demonstration_rows", monkeypatch)
    cli = fit_config("quickstart.yaml", tmp_path, "--model.class_path=subclasses.SuccessfulDemosSFT",
                     f"--data.init_args.path={demos}")
    assert cli.trainer.global_step >= 1 and torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    ((_, rollouts), rows), = calls
    assert [r.success for r in rollouts] == [True, False, True, False]
    assert {row.meta["task_id"] for row in rows} == {episodes[0].task.task_id, episodes[2].task.task_id}
    assert cli.datamodule.rows == rows  # what the epoch trained on


@pytest.mark.parametrize("name, expected", [("FilteredBCActorCritic", lambda a: (a > 0).float()),
                                            ("ClonedActorCritic", torch.ones_like)])
def test_actor_weight_overrides_in_fit(name, expected, examples, tmp_path, monkeypatch):
    """configs/multi2/system2_offline.yaml with fresh adapters: the actor's weights are the
    subclass's `actor_weights` (`FilteredBCActorCritic`: 1 exactly where the critic's advantage is
    positive; `ClonedActorCritic`: 1 everywhere), where the default's are exponential."""
    import subclasses

    from lit_agents.modules import System2ActorCritic

    cls = getattr(subclasses, name)
    calls = spy(cls, "actor_weights", monkeypatch)
    overlay = {"model": {"init_args": {
        "policy": {"init_args": {"adapters": None, "frozen_adapters": None, "roles": ["executor", "planner"]}},
        "critic_warmup_steps": 0, "head_width": 16}},
        "data": {"init_args": {"path": None, "demos": 4}}}
    cli = fit_config("multi2/system2_offline.yaml", tmp_path, f"--model.class_path=subclasses.{name}",
                     "--model.init_args.policy.init_args.lora_r=4", overlay=overlay)
    assert cli.trainer.current_epoch == 1 and type(cli.model) is cls
    assert len(calls) == cli.trainer.num_training_batches  # one call per batch
    for (module, advantages, episodes), weights in calls:
        assert torch.equal(weights, expected(advantages))
        assert not torch.allclose(System2ActorCritic.actor_weights(module, advantages, episodes), weights)
    assert cli.trainer.callback_metrics["train/weight_max"] <= 1.0
    assert 0.0 < cli.trainer.callback_metrics["train/entropy"] <= math.log(cli.model.policy.model.config.vocab_size)


def test_step_cost_subgoal_rewards_in_fit(examples, tmp_path, monkeypatch):
    """configs/multi2/system2_grpo.yaml with fresh adapters (KL to the base): the subgoal
    episodes score `StepCostSubgoalGRPO.subgoal_rewards`, the default's minus 0.05 a step, so
    an untrained executor that meets no subgoal still ranks its episodes by their length."""
    import subclasses

    from lit_agents.modules import System2GRPO

    calls = spy(subclasses.StepCostSubgoalGRPO, "subgoal_rewards", monkeypatch)
    overlay = {"trainer": {"callbacks": [{"class_path": "lit_agents.callbacks.KLAnchor",
                                          "init_args": {"coef": 0.02, "reference": "base"}}]},
               "model": {"init_args": {"policy": {"init_args": {
                   "adapters": None, "frozen_adapters": None, "roles": ["executor", "planner"]}}}}}
    cli = fit_config("multi2/system2_grpo.yaml", tmp_path, "--model.class_path=subclasses.StepCostSubgoalGRPO",
                     "--model.init_args.policy.init_args.lora_r=4", *ROLLOUTS,
                     "--data.init_args.agent.init_args.max_subgoals=2",
                     "--data.init_args.agent.init_args.max_subgoal_steps=3", overlay=overlay)
    assert cli.trainer.current_epoch == 1 and type(cli.model) is subclasses.StepCostSubgoalGRPO
    assert calls  # the rows and the epoch's logged statistics both read the shaped score
    for (module, episodes), rewards in calls:
        steps = torch.tensor([float(len(s.calls)) for _, _, s in episodes])
        assert torch.allclose(rewards, System2GRPO.subgoal_rewards(module, episodes) - 0.05 * steps)
        assert any(len(s.calls) > 1 for _, _, s in episodes)


def test_subgoal_line_agent_in_fit(examples, tmp_path, monkeypatch):
    """configs/multi2/system2_online.yaml with fresh adapters and no buffer seed: every subgoal
    the planner sets is `SubgoalLineAgent.parse_subgoal` of its text, and the executor is told it."""
    import subclasses

    calls = spy(subclasses.SubgoalLineAgent, "parse_subgoal", monkeypatch)
    overlay = {"model": {"init_args": {
        "policy": {"init_args": {"adapters": None, "frozen_adapters": None,
                                 "roles": ["executor", "planner", "executor_offline"]}},
        "buffer_seed": None, "keep_failures": 1.0, "head_width": 16}}}
    cli = fit_config(
        "multi2/system2_online.yaml",
        tmp_path,
        "--data.init_args.agent.class_path=subclasses.SubgoalLineAgent",
        "--model.init_args.policy.init_args.lora_r=4",
        *ROLLOUTS,
        "--data.init_args.agent.init_args.plan_tokens=6",
        "--data.init_args.agent.init_args.max_steps=3",
        overlay=overlay,
    )
    assert cli.trainer.current_epoch == 1 and type(cli.datamodule.agent) is subclasses.SubgoalLineAgent
    planned = [(s, r.sessions[s.session_id + 1]) for r in cli.datamodule.last_rollouts for s in r.sessions
               if s.meta["role"] == "planner"]
    assert len(calls) == len(planned) >= 4  # every planner call, every episode
    parsed = {text: subgoal for (_, text), subgoal in calls}
    for planner, executor in planned:
        assert planner.goal == parsed[planner.calls[0].completion_text]
        assert executor.calls[0].prompt_text.endswith(f"Subgoal: {planner.goal}")


def test_subgoal_line_parsing(examples):
    from subclasses import SubgoalLineAgent

    from lit_agents.agents import HierarchicalAgent

    agent, default = SubgoalLineAgent(), HierarchicalAgent()
    text = "I need planks first.\nSubgoal: craft 4 oak planks."
    assert agent.parse_subgoal(text) == "craft 4 oak planks" and default.parse_subgoal(text) == "I need planks first."
    assert agent.parse_subgoal("- craft 1 stick\nthen more") == "craft 1 stick"
    assert agent.parse_subgoal("1. get 2 oak log") == "get 2 oak log"
    assert agent.parse_subgoal("craft 4 oak planks") == default.parse_subgoal("craft 4 oak planks")
    assert agent.parse_subgoal("") == ""


def test_discounted_session_advantages_by_hand(examples, policy):
    from subclasses import DiscountedSessionMosaic

    from lit_agents.modules import MosaicPolicy

    a = Rollout("t", 0, [_session(0, "main", 0.0, 1.0)], reward=1.0, success=True)
    b = Rollout("t", 0, [_session(0, "main", 0.0, 0.5), _session(1, "compaction", 0.5, 0.6),
                         _session(2, "compaction", 0.6, 1.0)], reward=1.0, success=True)
    c = Rollout("t", 0, [_session(0, "main", 0.0, 0.2), _session(1, "compaction", 0.2, 0.2)], reward=0.0)
    base = MosaicPolicy(policy).session_advantages([a, b, c])
    got = DiscountedSessionMosaic(policy, session_discount=0.5).session_advantages([a, b, c])
    # compactions after each session: a [0]; b [2, 1, 0]; c [1, 0]
    want = [[base[0][0]], [base[1][0] / 4, base[1][1] / 2, base[1][2]], [base[2][0] / 2, base[2][1]]]
    assert got == [pytest.approx(w) for w in want]
    with pytest.raises(ValueError, match="session_discount"):
        DiscountedSessionMosaic(policy, session_discount=0.0)


def test_discounted_session_mosaic_in_fit(examples, tmp_path, monkeypatch):
    """configs/mosaic/compaction_mosaic.yaml on examples/guess_number.py's env (its shaped
    rewards give a random model a learning signal), a budget that forces compaction: the
    advantages trained on are `DiscountedSessionMosaic.session_advantages`, not Mosaic's own."""
    import subclasses

    from lit_agents.modules import MosaicPolicy

    calls = spy(subclasses.DiscountedSessionMosaic, "session_advantages", monkeypatch)
    env = {"data": {"init_args": {"env": {"class_path": "guess_number.GuessNumber", "init_args": {"shaping": 0.5}}}}}
    cli = fit_config(
        "mosaic/compaction_mosaic.yaml",
        tmp_path,
        "--model.class_path=subclasses.DiscountedSessionMosaic",
        "--model.init_args.session_discount=0.5",
        # per-call credit re-credits each call's trajectory term, and a session then records the
        # mean of its calls' (`session_rows`): off, each session's rows carry exactly the override's
        "--model.init_args.error_baseline=false",
        "--model.init_args.policy.init_args.lora_r=4",
        *ROLLOUTS,
        "--data.init_args.agent.init_args.max_steps=4",
        "--data.init_args.agent.init_args.summary_tokens=4",
        "--data.init_args.agent.init_args.context_budget=120",
        overlay=env,
    )
    assert_trained(cli)
    ((module, rollouts), advantages), = calls
    base = MosaicPolicy.session_advantages(module, rollouts)
    changed = 0
    for rollout, got, want in zip(rollouts, advantages, base):
        kinds = [s.kind for s in rollout.sessions]
        assert got == pytest.approx([w * 0.5 ** kinds[k + 1:].count("compaction") for k, w in enumerate(want)])
        changed += got != pytest.approx(want)
        if any(got):  # a rollout kept for training: each session's rows carried its discounted advantage
            assert [s.advantage for s in rollout.sessions] == pytest.approx(got)
    assert changed >= 1


def test_early_compaction_agent_in_fit(examples, tmp_path, monkeypatch):
    """configs/mosaic/compaction_mosaic.yaml with `EarlyCompactionAgent` at half the budget:
    sessions compact where `MultiSessionAgent.should_compact` would have let them go on."""
    import subclasses

    from lit_agents.agents import MultiSessionAgent

    calls = spy(subclasses.EarlyCompactionAgent, "should_compact", monkeypatch)
    cli = fit_config(
        "mosaic/compaction_mosaic.yaml",
        tmp_path,
        "--data.init_args.agent.class_path=subclasses.EarlyCompactionAgent",
        "--data.init_args.agent.init_args.compact_at=0.5",
        "--model.init_args.policy.init_args.lora_r=4",
        "--model.init_args.drop_zero_signal=false",
        *ROLLOUTS,
        "--data.init_args.agent.init_args.max_steps=3",
        "--data.init_args.agent.init_args.summary_tokens=4",
    )
    assert_trained(cli)
    agent = cli.datamodule.agent
    assert type(agent) is subclasses.EarlyCompactionAgent and agent.context_budget == 256
    early = [
        tokens for (_, tokens), compact in calls if compact and not MultiSessionAgent.should_compact(agent, tokens)
    ]
    assert early and all(128 < t <= 256 - agent.max_new_tokens for t in early)
    # and the agent acted on every such decision: one compaction each (a goal with a short prompt
    # may not reach half the budget in 3 steps, so not every rollout compacts)
    assert sum(r.meta["compactions"] for r in cli.datamodule.last_rollouts) == sum(compact for _, compact in calls) >= 1


def test_early_compaction_trigger_by_hand(examples):
    from subclasses import EarlyCompactionAgent

    from lit_agents.agents import MultiSessionAgent

    early = EarlyCompactionAgent(compact_at=0.5, context_budget=100, max_new_tokens=10)
    default = MultiSessionAgent(context_budget=100, max_new_tokens=10)
    assert [early.should_compact(t) for t in (50, 51, 91)] == [False, True, True]
    assert [default.should_compact(t) for t in (50, 51, 90, 91)] == [False, False, False, True]
    with pytest.raises(ValueError, match="compact_at"):
        EarlyCompactionAgent(compact_at=1.5)


def test_step_cost_node_rewards_by_hand(examples, policy):
    from subclasses import StepCostRAO

    # tree A: root ok (2 turns), children ok (1 turn) / failed (3 turns); tree B: a failed root (4 turns)
    a = Rollout("t", 0, [_node(0, None, 0, True, 2), _node(1, 0, 1, True, 1), _node(2, 0, 1, False, 3)], 1.0, True)
    b = Rollout("t", 0, [_node(0, None, 0, False, 4)], 0.0, False)
    module = StepCostRAO(policy, step_cost=0.1, lam=0.4, depth_weighting=False)
    # R: root A 1 + 0.4 * 0.5 - 0.2 = 1.0, children 0.9 / -0.3, root B -0.4; baselines A -0.4, B 1.0
    assert module.node_rewards([a, b]).tolist() == pytest.approx([1.0, 0.9, -0.3, -0.4])
    advantages = module.node_advantages([a, b])
    assert advantages[0] == pytest.approx([1.4, 1.3, 0.1]) and advantages[1] == pytest.approx([-1.4])


def test_depth_aware_prompts_by_hand(examples, policy):
    from subclasses import DepthAwareAgent

    from lit_agents.envs import TextCraftSynth

    env = TextCraftSynth(difficulty="easy")
    state, intro = env.reset(env.tasks("train")[0])
    agent = DepthAwareAgent(max_depth=2)
    assert agent.node_prompt(env, state, 0) == f"{intro}\nDepth 0 of at most 2."
    assert agent.node_prompt(env, state, 2).endswith("Depth 2, the deepest: launch_subagent is refused here.")
    assert DepthAwareAgent(recursive=False).node_prompt(env, state, 0) == intro


@pytest.mark.parametrize(("flag", "owner", "hook"), [
    ("--model.class_path=subclasses.StepCostRAO", "StepCostRAO", "node_rewards"),
    ("--data.init_args.agent.class_path=subclasses.DepthAwareAgent", "DepthAwareAgent", "node_prompt"),
], ids=["node_rewards", "node_prompt"])
def test_rao_subclass_hooks_run_in_fit(flag, owner, hook, examples, tmp_path, monkeypatch):
    """configs/rao/recursive.yaml on the embedded default built for TextCraft-Synth: the node
    rewards RAO trains on are `StepCostRAO.node_rewards` (a cost of 0.1 per turn); every node's
    first prompt is `DepthAwareAgent.node_prompt`."""
    import subclasses

    from lit_agents.modules import RAOPolicy

    calls = spy(getattr(subclasses, owner), hook, monkeypatch)
    cost = ["--model.init_args.step_cost=0.1"] if hook == "node_rewards" else []
    cli = fit_config(
        "rao/recursive.yaml",
        tmp_path,
        flag,
        *cost,
        "--model.init_args.policy.init_args.tiny.corpus=textcraft_synth",
        *ROLLOUTS,
        "--data.init_args.agent.init_args.max_steps=2",
    )
    assert cli.trainer.global_step >= 1 and torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    rollouts = cli.datamodule.last_rollouts
    nodes = [s for r in rollouts for s in r.sessions]
    if hook == "node_rewards":
        ((module, seen), rewards), = calls
        turns = torch.tensor([float(s.meta["steps"]) for s in nodes])
        assert seen is rollouts and torch.allclose(rewards, RAOPolicy.node_rewards(module, rollouts) - 0.1 * turns)
        assert turns.min() >= 1
    else:
        assert len(calls) == len(nodes)
        assert all(s.calls[0].prompt_text.endswith(f"Depth {s.depth} of at most 10.") for s in nodes)


# ----------------------------------------------------------------------------- QLoRA on a GPU
@pytest.mark.skipif(not torch.cuda.is_available(), reason="QLoRA (load_in_4bit) needs a CUDA GPU")
def test_qlora_gpu_check(tmp_path):
    pytest.importorskip("bitsandbytes")
    script = ROOT / "tests" / "scripts" / "qlora_gpu_check.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "OK" in done.stdout
