"""Multi2's System 2 actor-critic: what trains, what stays frozen, targets, KL at the start."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer
from lora_weights import set_lora_b

from lit_agents.agents import HierarchicalAgent
from lit_agents.algorithms.collate import Batch
from lit_agents.callbacks import KLAnchor
from lit_agents.data import DemonstrationDataModule, RolloutDataModule
from lit_agents.modules import System1SFT, System2ActorCritic
from lit_agents.policy import AgentPolicy


def _trainer(tmp_path, epochs=1, callbacks=(), **kw):
    return Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=1,
                   num_sanity_val_steps=0, default_root_dir=tmp_path, callbacks=list(callbacks), **kw)


def _agent(short=False):
    if short:  # untrained live rollouts: keep them short
        return HierarchicalAgent(max_new_tokens=12, plan_tokens=10, max_subgoals=3, max_subgoal_steps=3, max_steps=6)
    return HierarchicalAgent(max_new_tokens=12, plan_tokens=10)


def _params(policy, role):
    return {n: p.detach().clone() for n, p in policy.named_parameters() if f".{role}." in n}


def test_offline_trains_executor_only_and_heads(tiny_config, textcraft, tmp_path):
    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    module = System2ActorCritic(policy, phase="offline", lr=1e-2, critic_lr=1e-2, head_width=16)
    data = DemonstrationDataModule(textcraft, _agent(), demos=6, noisy=0.5, epsilon=0.5, val_tasks=2,
                                   max_tokens_per_batch=2048)
    planner, executor = _params(policy, "planner"), _params(policy, "executor")
    q_before = [p.clone() for p in module.q.parameters()]
    _trainer(tmp_path).fit(module, datamodule=data)
    assert all(torch.equal(p, dict(policy.named_parameters())[n]) for n, p in planner.items())
    assert any(not torch.equal(p, dict(policy.named_parameters())[n]) for n, p in executor.items())
    assert any(not torch.equal(a, b) for a, b in zip(q_before, module.q.parameters()))
    assert data.rows and all(r.role == "executor" and len(r.meta["spans"]) == len(r.meta["rewards"]) for r in data.rows)
    assert any(not r.meta["met"] for r in data.rows)  # the noisy half gives failures to learn from


def test_offline_data_can_add_the_starting_policys_own_episodes(tiny_config, textcraft, tmp_path):
    """``behavior_episodes``: the policy plays train tasks itself before the first step, and its
    episodes (failures included: an untrained policy fails them all) join the demonstrations."""
    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    module = System2ActorCritic(policy, phase="offline", lr=1e-2, critic_lr=1e-2, head_width=16)
    data = DemonstrationDataModule(textcraft, _agent(short=True), demos=2, val_tasks=2, max_tokens_per_batch=2048,
                                   behavior_episodes=3, behavior_chunk=2)
    played = []
    real = data.behavior_rollouts
    data.behavior_rollouts = lambda: played.extend(real()) or played
    _trainer(tmp_path).fit(module, datamodule=data)
    assert len(played) == 3 and not any(r.success for r in played)
    sampled = [c for r in played for s in r.sessions for c in s.calls]
    assert sampled and all(any(lp != 0 for lp in c.logprobs) for c in sampled)  # the sampler's, not a replay's
    behavior = module.demonstration_rows(played)
    assert behavior and len(data.rows) == len(module.demonstration_rows(data.demonstrations())) + len(behavior)
    assert not any(r.meta["met"] for r in behavior)
    with pytest.raises(ValueError, match="behavior_episodes"):
        DemonstrationDataModule(textcraft, _agent(), behavior_episodes=-1)


def test_targets_move_by_polyak_only(tiny_config):
    module = System2ActorCritic(AgentPolicy(tiny=tiny_config, roles=["executor"], lora_r=4), tau=0.25, head_width=8)
    target = [p.clone() for p in module.q_target.parameters()]
    with torch.no_grad():
        for p in module.q.parameters():
            p.add_(1.0)
    live = [p.clone() for p in module.q.parameters()]
    module._polyak()
    for t_old, q, t_new in zip(target, live, module.q_target.parameters()):
        assert torch.allclose(t_new, 0.75 * t_old + 0.25 * q)
    assert not any(p.requires_grad for p in module.q_target.parameters())


def test_transitions_mark_each_rows_last_action_terminal(tiny_config, textcraft):
    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    agent = HierarchicalAgent()
    module = System2ActorCritic(policy, head_width=8)
    rollout = agent.expert_rollout(policy, textcraft, textcraft.tasks("train")[1])
    rows = module.demonstration_rows([rollout])
    from lit_agents.algorithms.collate import collate_rows

    batch = collate_rows(rows, policy.pad_id, with_meta=True)
    with torch.no_grad():
        t = module._transitions(batch)
    assert t["rewards"].tolist() == [0.0, 0.0, 1.0, 2.0]
    assert t["dones"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert t["next"].tolist() == [1, 2, 2, 3] and t["episodes"].tolist() == [0, 0, 0, 1]
    # h_t is the hidden state at the action's last token (its end-of-turn token)
    end = rows[0].meta["spans"][0][1] - 1
    assert batch["input_ids"][0, end].item() == policy.chat.end_id


def _expert_batch(tiny_config, textcraft, **kwargs):
    """An expert episode's executor rows (4 actions over 2 subgoal episodes) and a module."""
    from lit_agents.algorithms.collate import collate_rows

    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    module = System2ActorCritic(policy, head_width=8, **kwargs)
    rollout = HierarchicalAgent().expert_rollout(policy, textcraft, textcraft.tasks("train")[1])
    return module, collate_rows(module.demonstration_rows([rollout]), policy.pad_id, with_meta=True)


def test_q_reads_each_actions_last_token_and_v_the_token_before_the_action(tiny_config, textcraft):
    """For every action (a span of completion tokens), Q's feature is the hidden state at the
    span's last token and V's the hidden state just before the span (the end of its prompt)."""
    module, batch = _expert_batch(tiny_config, textcraft)
    with torch.no_grad():
        t = module._transitions(batch)
        hidden = module.policy.hidden_states(batch["input_ids"], batch["attention_mask"])
    k = 0
    for b, meta in enumerate(batch["meta"]):
        for start, end in meta["spans"]:
            assert torch.equal(t["h"][k], hidden[b, end - 1]) and torch.equal(t["s"][k], hidden[b, start - 1])
            k += 1
    assert k == len(t["h"]) == 4


@pytest.mark.parametrize("phase", ["offline", "online"])
def test_td_targets_bootstrap_from_v_offline_and_the_next_actions_q_online(tiny_config, textcraft, phase):
    """Target heads made constant (Q_target = 2, V_target = -1): the TD target of each action is
    ``r + gamma * (1 - done) * c`` with c = V_target of the next state offline (the paper's) and
    Q_target of the next action online (AWAC), on the expert episode's rewards [0, 0, 1, 2] and
    dones [0, 0, 1, 1]."""
    module, batch = _expert_batch(tiny_config, textcraft, phase=phase, gamma=0.9)
    with torch.no_grad():
        for head, value in ((module.q_target, 2.0), (module.v_target, -1.0)):
            head.net[-1].weight.zero_()
            head.net[-1].bias.fill_(value)
        _, _, stats = module._losses(Batch(batch))
    c = -1.0 if phase == "offline" else 2.0
    expected = [r + 0.9 * (1 - d) * c for r, d in zip([0.0, 0.0, 1.0, 2.0], [0.0, 0.0, 1.0, 1.0])]
    assert stats["td_target"].item() == pytest.approx(sum(expected) / 4)


def test_online_awac_weights_average_one_within_each_episode(tiny_config):
    """Online, the AWAC weights are normalised per executor episode (the paper's), not over the
    batch: each episode's weights average 1 whatever the other episodes' advantages."""
    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    module = System2ActorCritic(policy, phase="online", alpha=1.0, weight_clip=100.0, head_width=8)
    advantages, episodes = torch.tensor([0.5, -0.5, 1.0, 0.0, 2.0]), torch.tensor([0, 0, 1, 1, 1])
    weights = module.actor_weights(advantages, episodes)
    assert weights[:2].mean().item() == pytest.approx(1.0) and weights[2:].mean().item() == pytest.approx(1.0)
    assert weights[0] > weights[1] and weights[4] > weights[2] > weights[3]


def test_step_cost_is_charged_on_every_executor_action(tiny_config, textcraft):
    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    module = System2ActorCritic(policy, head_width=8, step_cost=0.25)
    rollout = HierarchicalAgent().expert_rollout(policy, textcraft, textcraft.tasks("train")[1])
    from lit_agents.algorithms.collate import collate_rows

    batch = collate_rows(module.demonstration_rows([rollout]), policy.pad_id, with_meta=True)
    with torch.no_grad():
        t = module._transitions(batch)
    assert t["rewards"].tolist() == [-0.25, -0.25, 0.75, 1.75]  # the paper's [0, 0, 1, 2], each step charged
    with pytest.raises(ValueError, match="step_cost"):
        System2ActorCritic(policy, step_cost=-0.1)


def _two_one_step_episodes():
    """Two one-step episodes from the same 5-token prompt: the first action earns 1, the other 0."""
    prompt = [5, 6, 7, 8, 9]
    return {
        "input_ids": torch.tensor([prompt + [20, 21], prompt + [30, 31]]),
        "attention_mask": torch.ones(2, 7, dtype=torch.long),
        "action_mask": torch.tensor([[0] * 5 + [1, 1]] * 2),
        "meta": [{"spans": [(5, 7)], "rewards": [1.0], "dones": [1.0]},
                 {"spans": [(5, 7)], "rewards": [0.0], "dones": [1.0]}],
    }


def _fit_critic(module, batch, steps=400):
    """Critic steps alone on one batch (targets by Polyak); returns the last step's statistics."""
    opt = torch.optim.Adam([*module.q.parameters(), *module.v.parameters()], lr=1e-2)
    for _ in range(steps):
        critic_loss, _, stats = module._losses(Batch(batch))
        opt.zero_grad()
        critic_loss.backward()
        opt.step()
        module._polyak()
    return stats


def test_v_reads_the_state_so_q_minus_v_ranks_actions_from_it(tiny_config):
    """Two one-step episodes from the same prompt: the action of the first earns 1, the other's 0.
    V sees only the state (the same for both), so it learns the state's expectile and Q - V is
    positive for the good action and negative for the bad one. (V on the action's own hidden
    state regresses onto Q itself and leaves Q - V near 0 for both.)"""
    torch.manual_seed(0)
    policy = AgentPolicy(tiny=tiny_config, roles=["executor"], lora_r=4)
    module = System2ActorCritic(policy, head_width=16, tau=0.2, kappa=0.7, critic_lr=1e-2)
    batch = _two_one_step_episodes()
    with torch.no_grad():
        t = module._transitions(batch)
    assert torch.equal(t["s"][0], t["s"][1]) and not torch.equal(t["h"][0], t["h"][1])
    _fit_critic(module, batch)
    with torch.no_grad():
        v, q = module.v(t["s"].detach()), module.q(t["h"].detach())
    assert v[0].item() == pytest.approx(v[1].item()) and v[0].item() == pytest.approx(0.7, abs=0.1)
    adv = q - v
    assert adv[0] > 0.15 and adv[1] < -0.4


class _Recording(System2ActorCritic):
    def actor_weights(self, advantages, episodes):
        self.seen = advantages
        return super().actor_weights(advantages, episodes)


@pytest.mark.parametrize("baseline", ["episode_mean", "v"])
def test_online_v_baseline_ranks_one_action_episodes_the_episode_mean_cannot(tiny_config, baseline):
    """Online, two one-step buffer episodes from the same state, rewards 1 and 0. The paper's
    baseline (the episode's mean Q_target) is the action's own Q_target here, so every advantage
    is 0; a V head kept online (`online_baseline="v"`) learns the state's value and ranks the two."""
    torch.manual_seed(0)
    policy = AgentPolicy(tiny=tiny_config, roles=["executor"], lora_r=4)
    module = _Recording(policy, phase="online", online_baseline=baseline, head_width=16, tau=0.2, critic_lr=1e-2)
    v_before = [p.clone() for p in module.v.parameters()]
    stats = _fit_critic(module, _two_one_step_episodes())
    v_moved = any(not torch.equal(a, b) for a, b in zip(v_before, module.v.parameters()))
    adv = module.seen
    if baseline == "episode_mean":
        assert not v_moved and "v_loss" not in stats
        assert adv.abs().max().item() == 0.0
    else:
        assert v_moved and "v_loss" in stats
        assert adv[0] > 0.15 and adv[1] < -0.4


def _online_policy(tiny_config, tmp_path):
    """A planner, a trainable executor and its frozen copy ``executor_offline``, as online stages load them."""
    first = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    folder = tmp_path / "adapters"
    for role in ("planner", "executor"):
        first.save_role(role, folder)
    policy = AgentPolicy(tiny=tiny_config, roles=["scratch"], lora_r=4)
    policy.load_role("planner", folder / "planner")
    policy.load_role("executor", folder / "executor", trainable=True)
    policy.load_role("executor_offline", folder / "executor")
    return policy


def test_online_kl_to_offline_executor_is_zero_at_first_step(tiny_config, textcraft, tmp_path):
    policy = _online_policy(tiny_config, tmp_path)
    from lit_agents.data.demos import write_episodes

    seed = tmp_path / "offline.jsonl"
    write_episodes([_agent().expert_episode(textcraft, t) for t in textcraft.tasks("train")[:3]], seed)
    module = System2ActorCritic(policy, phase="online", lr=1e-2, head_width=8, rows_per_epoch=8,
                                buffer_seed=str(seed), keep_failures=1.0)
    seen = []

    class Spy(KLAnchor):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(float(trainer.callback_metrics["train/kl"]))

    data = RolloutDataModule(textcraft, _agent(short=True), tasks_per_epoch=2, group_size=2, val_tasks=0)
    planner = _params(policy, "planner")
    _trainer(tmp_path, epochs=1, callbacks=[Spy(coef=0.1, reference="executor_offline")]).fit(module, datamodule=data)
    assert seen and seen[0] == pytest.approx(0.0, abs=1e-6)
    assert all(torch.equal(p, dict(policy.named_parameters())[n]) for n, p in planner.items())
    assert all(r.role == "executor" for r in module.buffer)
    seeded = [r for r in module.buffer if r.meta["task_id"].endswith("/0") and r.meta["met"]]
    assert len(module.buffer) > len(seeded) >= 3  # the demos' successful subgoals, then the new episodes


def test_online_vocab_kl_is_flat_at_the_offline_executor_and_pulls_toward_it(tiny_config, textcraft, tmp_path):
    """The exact KL over the vocabulary on buffer rows: no gradient while the online executor
    equals the offline one; once moved away, steps on the KL alone bring it back."""
    from lit_agents.algorithms.collate import collate_rows

    torch.manual_seed(0)
    AgentPolicy(tiny=tiny_config, roles=["executor"], lora_r=4, lora_targets="all-linear").save_role(
        "executor", tmp_path / "a"
    )
    policy = AgentPolicy(tiny=tiny_config, roles=["scratch"], lora_r=4, lora_targets="all-linear")
    policy.load_role("executor", tmp_path / "a" / "executor", trainable=True)
    policy.load_role("executor_offline", tmp_path / "a" / "executor")
    module = System2ActorCritic(policy, phase="online", head_width=8)
    assert module.kl_needs_distributions
    rollout = HierarchicalAgent().expert_rollout(policy, textcraft, textcraft.tasks("train")[1])
    tensors = collate_rows(module.demonstration_rows([rollout]), policy.pad_id, with_meta=True)
    anchor = KLAnchor(coef=1.0, reference="executor_offline")
    params = [p for p in policy.parameters() if p.requires_grad]

    def kl() -> torch.Tensor:
        b = Batch(tensors)
        b.ref_hidden, b.ref_head = anchor.reference_hidden(module, b)
        return module._kl(module._transitions(b.tensors), b)

    at_start = kl()
    grads = torch.autograd.grad(at_start, params, allow_unused=True)
    assert at_start.item() == pytest.approx(0.0, abs=1e-6)
    assert max(g.abs().max().item() for g in grads if g is not None) < 1e-6
    set_lora_b(policy, std=0.03, role="executor")  # larger saturates this random model's KL
    opt = torch.optim.Adam(params, lr=3e-3)
    values = []
    for _ in range(30):
        loss = kl()
        opt.zero_grad()
        loss.backward()
        opt.step()
        values.append(loss.item())
    assert values[0] > 0.005 and values[-1] < 0.2 * values[0]


def test_planner_sft_trains_on_planner_sessions_only(tiny_config, textcraft, tmp_path):
    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    data = DemonstrationDataModule(textcraft, _agent(), demos=4, val_tasks=0)
    _trainer(tmp_path).fit(System1SFT(policy, role="planner", lr=1e-2), datamodule=data)
    assert data.rows and {r.role for r in data.rows} == {"planner"}


def test_online_checkpoint_restores_heads_buffer_and_counters(tiny_config, textcraft, tmp_path):
    """Resuming Multi2's online phase restores the executor adapter, Q/V heads and their targets,
    both optimizers, the replay buffer with its sampler state and the critic warm-up counter."""
    from lightning.pytorch import Callback
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_agents.checkpointing import AtomicCheckpointIO

    def make():
        torch.manual_seed(0)
        policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
        policy.set_role("executor")
        module = System2ActorCritic(policy, phase="online", lr=1e-2, head_width=8, rows_per_epoch=4,
                                    keep_failures=1.0)
        return module, RolloutDataModule(textcraft, _agent(short=True), tasks_per_epoch=2, group_size=2, val_tasks=0)

    module, data = make()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_on_train_epoch_end=True)
    Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
            enable_model_summary=False, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
            default_root_dir=tmp_path, callbacks=[ckpt], plugins=[AtomicCheckpointIO()]).fit(module, datamodule=data)
    saved = {
        "heads": {n: p.detach().clone() for n, p in module.named_parameters() if not n.startswith("policy.")},
        "executor": _params(module.policy, "executor"),
        "buffer": [(r.input_ids, r.meta) for r in module.buffer],
        "rng": module._rng.getstate(),
        "batches": module._batches,
        "targets": [p.clone() for p in [*module.q_target.parameters(), *module.v_target.parameters()]],
    }
    assert saved["buffer"] and saved["batches"] > 0

    restored = {}

    class Restored(Exception):
        pass

    class Grab(Callback):
        def on_fit_start(self, trainer, pl_module):  # the module is restored, no rollout yet
            restored.update(
                heads={n: p.detach().clone() for n, p in pl_module.named_parameters() if not n.startswith("policy.")},
                executor=_params(pl_module.policy, "executor"),
                buffer=[(r.input_ids, r.meta) for r in pl_module.buffer], rng=pl_module._rng.getstate(),
                batches=pl_module._batches,
                targets=[p.clone() for p in [*pl_module.q_target.parameters(), *pl_module.v_target.parameters()]],
            )

        def on_train_start(self, trainer, pl_module):  # optimizer states are restored by now
            restored["optimizers"] = [opt.state_dict()["state"] for opt in trainer.optimizers]
            raise Restored  # only the restored state matters here

    fresh, data = make()
    assert not fresh.buffer
    with pytest.raises(Restored):
        _trainer(tmp_path, epochs=2, callbacks=[Grab()], plugins=[AtomicCheckpointIO()]).fit(
            fresh, datamodule=data, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    for key in ("heads", "executor"):
        assert saved[key].keys() == restored[key].keys()
        assert all(torch.equal(saved[key][n], restored[key][n]) for n in saved[key]), key
    assert all(torch.equal(a, b) for a, b in zip(saved["targets"], restored["targets"]))
    assert restored["buffer"] == saved["buffer"] and restored["rng"] == saved["rng"]
    assert restored["batches"] == saved["batches"]
    assert all(restored["optimizers"])  # Adam moments for both optimizers


def _subgoal_rollout(group, first_prompt, met, solved=None):
    """A hierarchical rollout: a planner session, then one executor subgoal episode whose first
    prompt is ``first_prompt`` and which meets its subgoal or not; the task is solved when
    ``solved`` (default: when met)."""
    from lit_agents.types import Call, Rollout, Session

    planner = Session(0, calls=[Call([5, 6], [7], [-0.1], role="planner")], meta={"role": "planner"})
    calls = [Call(list(first_prompt), [8, 9], [-0.2, -0.3], role="executor"), Call([4], [10], [-0.4], role="executor")]
    executor = Session(1, calls=calls, success=met,
                       meta={"role": "executor", "rewards": [0.0, float(met)], "dones": [0.0, 1.0]})
    solved = met if solved is None else solved
    return Rollout(f"t{group}", group, [planner, executor], reward=float(solved), success=solved)


def test_system2_grpo_scores_each_subgoal_episode_against_those_from_the_same_state(tiny_config):
    """Episodes that started from the same executor prompt form a group: a met one gets A > 0, a
    missed one A < 0, on its executor tokens only; a group of one, or of equal scores, trains nothing;
    planner sessions never give rows."""
    from lit_agents.modules import System2GRPO

    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    module = System2GRPO(policy)
    rollouts = [_subgoal_rollout(0, [1, 2], True), _subgoal_rollout(0, [1, 2], False),
                _subgoal_rollout(0, [1, 2], False),  # the same state and subgoal: a group with a signal
                _subgoal_rollout(1, [3], True),  # alone: no comparison
                _subgoal_rollout(2, [2, 2], True), _subgoal_rollout(2, [2, 2], True)]  # equal scores
    rows = module.rollouts_to_rows(rollouts)
    assert [r.meta["rollout"] for r in rows] == [0, 1, 2]
    assert all(r.role == "executor" and r.meta["session"] == 1 for r in rows)
    met, *missed = rows
    assert met.meta["advantage"] > 0 > missed[0].meta["advantage"] == missed[1].meta["advantage"]
    trained = [a for a, m in zip(met.advantages, met.action_mask) if m]
    assert len(trained) == 3 and set(trained) == {met.meta["advantage"]}
    assert not any(a for a, m in zip(met.advantages, met.action_mask) if not m)
    # without the filter the signal-free episodes give rows too, with advantage 0
    everything = System2GRPO(policy, drop_zero_signal=False).rollouts_to_rows(rollouts)
    assert len(everything) == 6 and [r.meta["advantage"] for r in everything[3:]] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="not a role of the policy"):
        System2GRPO(policy, role="nope")


def test_system2_grpo_task_reward_ranks_the_subgoal_episodes_whose_task_was_solved(tiny_config):
    """Both episodes meet their subgoal, only one's rollout solves the task: by Multi2's executor
    reward alone they tie (no rows); with ``task_reward`` the solved one gets A > 0, the other A < 0."""
    from lit_agents.modules import System2GRPO

    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    rollouts = [_subgoal_rollout(0, [1, 2], True, solved=True), _subgoal_rollout(0, [1, 2], True, solved=False)]
    assert System2GRPO(policy).rollouts_to_rows(rollouts) == []
    module = System2GRPO(policy, task_reward=1.0)
    assert module.hparams.task_reward == 1.0
    _, groups, rewards = module.scored_episodes(rollouts)
    assert groups.tolist() == [0, 0] and rewards.tolist() == [2.0, 1.0]
    solved, unsolved = module.rollouts_to_rows(rollouts)
    assert solved.meta["advantage"] > 0 > unsolved.meta["advantage"]


def test_system2_grpo_online_fit_trains_the_executor_only_with_its_kl_anchor(tiny_config, textcraft, tmp_path):
    from lit_agents.modules import System2GRPO

    policy = _online_policy(tiny_config, tmp_path)

    scored = []

    class FirstWins(System2GRPO):  # an untrained executor meets no subgoal: the first of each group scores 1
        def subgoal_rewards(self, episodes):
            scored.append(len(episodes))
            groups = self.subgoal_groups(episodes).tolist()
            return torch.tensor([float(g not in groups[:n]) for n, g in enumerate(groups)])

    module = FirstWins(policy, lr=1e-2)
    data = RolloutDataModule(textcraft, _agent(short=True), tasks_per_epoch=2, group_size=3, val_tasks=0)
    planner, executor = _params(policy, "planner"), _params(policy, "executor")
    kl = []

    class Spy(KLAnchor):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            kl.append(float(trainer.callback_metrics["train/kl"]))

    trainer = _trainer(tmp_path, epochs=1, callbacks=[Spy(coef=0.1, reference="executor_offline")])
    trainer.fit(module, datamodule=data)
    assert len(scored) == 1  # the epoch's rows and its statistics share one scoring
    params = dict(policy.named_parameters())
    assert all(torch.equal(p, params[n]) for n, p in planner.items())
    assert any(not torch.equal(p, params[n]) for n, p in executor.items())  # `.executor.` names only
    assert kl and kl[0] == pytest.approx(0.0, abs=1e-6)
    rows = module.rollouts_to_rows(data.last_rollouts)
    assert rows and all(r.role == "executor" for r in rows)
    metrics = trainer.callback_metrics
    assert 0.0 <= float(metrics["rollout/subgoal_met"]) <= 1.0
    assert float(metrics["rollout/subgoal_grouped"]) > 0  # each task's first subgoal starts alike in its group
