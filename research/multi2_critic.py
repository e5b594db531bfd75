"""Does Multi2's offline critic rank the expert's actions above the others?

Its advantage ``A = Q(h) - V(s)`` on the offline stage's own demonstrations, split by whether each
executor action is the env's expert action in that state (`env.expert_subgoal_action`) or not (the
epsilon-noisy expert's random actions, or a behaviour policy's mistakes): mean A and share
with A > 0 per kind, the AUC ``P(A_expert > A_other)`` (0.5: no ranking), and for each actor weighting the
share of the imitation mass that falls on non-expert actions (uniform weights are behaviour
cloning; the stage's own ``actor_weights``; ``beta 10``; the binary filter ``1[A > 0]``).

Reads a `lit-agents multi2` offline stage's log folder (``config.yaml``, ``checkpoints/last.ckpt``:
the executor adapter and the critic heads) and the demonstrations file its data module read
(``data.init_args.path``, or ``--demos``); writes ``<log_dir>/critic.json``.

    python research/multi2_critic.py runs/multi2/system2_offline/version_0 [--episodes 800]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import Tensor

from lit_agents.algorithms.collate import collate_rows, transition_rows
from lit_agents.algorithms.losses import policy_anchored_weights
from lit_agents.data.demos import read_episodes
from lit_agents.pipelines import evaluate


def expert_labels(env, episode) -> list[bool]:
    """Per step of a recorded hierarchical episode: whether its action is the env's expert action
    for that step's subgoal in the state it was taken from."""
    state, _ = env.reset(episode.task)
    labels = []
    for (action, _), note in zip(episode.steps, episode.subgoals):
        labels.append(action == env.expert_subgoal_action(state, note["subgoal"]))
        env.step(state, action)
    return labels


def auc(advantages: Tensor, expert: Tensor) -> float:
    """``P(A_expert > A_other)``, ties counted half (nan without both kinds)."""
    good, bad = advantages[expert], advantages[~expert]
    if not len(good) or not len(bad):
        return float("nan")
    diff = good[:, None] - bad[None, :]
    return ((diff > 0).float().mean() + 0.5 * (diff == 0).float().mean()).item()


@torch.no_grad()
def advantages(module, rows, batch_rows: int = 8) -> Tensor:
    """``Q(h) - V(s)`` of every action of ``rows``, in row order then action order."""
    pad = module.policy.tokenizer.pad_token_id
    out = []
    for start in range(0, len(rows), batch_rows):
        t = module._transitions(collate_rows(rows[start:start + batch_rows], pad, with_meta=True))
        out.append((module.q(t["h"]) - module.v(t["s"])).float())
    return torch.cat(out)


def kind_stats(values: Tensor) -> dict:
    return {"actions": len(values), "mean": values.mean().item() if len(values) else float("nan"),
            "positive": (values > 0).float().mean().item() if len(values) else float("nan")}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir", type=Path, help="a Multi2 offline stage's log folder (…/system2_offline/version_0)")
    parser.add_argument("--demos", type=Path, default=None, help="default: the config's data.init_args.path")
    parser.add_argument("--episodes", type=int, default=800, help="the first N episodes of the file (0: all)")
    parser.add_argument("--ckpt", type=Path, default=None, help="default: <log_dir>/checkpoints/last.ckpt")
    args = parser.parse_args(argv)
    cli = evaluate.build([args.log_dir / "config.yaml"])
    module, dm = cli.model, cli.datamodule
    state = torch.load(args.ckpt or args.log_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    missing, unexpected = module.load_state_dict(state["state_dict"], strict=False)
    heads = [k for k in missing if k.split(".")[0] in ("q", "v", "q_target", "v_target")]
    if unexpected or heads:
        raise ValueError(f"the checkpoint is not this stage's: unexpected {unexpected[:3]}, missing heads {heads[:3]}")
    module.eval()
    demos = args.demos or dm.path
    if demos is None:
        raise ValueError("the config's data module reads no demonstrations file (data.init_args.path): pass --demos")
    episodes = read_episodes(demos)
    episodes = episodes[: args.episodes] if args.episodes else episodes
    labels = [expert_labels(dm.env, e) for e in episodes]
    rollouts = [dm.agent.replay(module.policy, dm.env, e, i) for i, e in enumerate(episodes)]
    rows = transition_rows(rollouts, module.role)
    # the rows' actions, in order, are their rollout's steps in order (one executor call a step)
    steps = [iter(lab) for lab in labels]
    expert = [next(steps[row.meta["rollout"]]) for row in rows for _ in row.meta["spans"]]
    adv = advantages(module, rows)
    expert_t = torch.tensor(expert, dtype=torch.bool)
    hp = module.hparams
    weights = {
        "uniform (cloning)": torch.ones_like(adv),
        "the stage's actor_weights": module.actor_weights(adv, torch.arange(len(adv))),
        "beta 10": policy_anchored_weights(adv, hp.lam, 10.0, hp.weight_clip),
        "1[A > 0]": (adv > 0).float(),
    }
    report = {
        "episodes": len(episodes), "solved": sum(e.success for e in episodes),
        "expert": kind_stats(adv[expert_t]), "other": kind_stats(adv[~expert_t]),
        "auc": auc(adv, expert_t), "std": adv.std().item(),
        "other_mass": {name: (w[~expert_t].sum() / w.sum()).item() if w.sum() > 0 else float("nan")
                       for name, w in weights.items()},
    }
    (args.log_dir / "critic.json").write_text(json.dumps(report, indent=2))
    print(f"{report['episodes']} episodes ({report['solved']} solved), {len(adv)} executor actions, "
          f"A std {report['std']:.3f}")
    for kind in ("expert", "other"):
        s = report[kind]
        print(f"  {kind:6s} actions {s['actions']:6d}: mean A {s['mean']:+.3f}, A > 0 {100 * s['positive']:.1f}%")
    print(f"  AUC P(A_expert > A_other) = {report['auc']:.3f}")
    for name, mass in report["other_mass"].items():
        print(f"  imitation mass on non-expert actions, {name}: {100 * mass:.1f}%")
    return report


if __name__ == "__main__":
    main()
