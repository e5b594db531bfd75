"""How much learning signal does one RL step carry?

Measured from a policy and an RL config.

Two measurements on the training module exactly as a config builds it (its advantage, loss,
normalization, shaping; any override), each from rollouts the data module plays:

- **Gradient agreement.** Gradients of the policy loss from rollouts of the same ``--tasks``
  train tasks under two sampling seeds (``g1``, ``g2``), and from disjoint tasks (``g3``). Their
  cosines say how much of one step's gradient is signal: independent noise of norm ``n`` on a
  signal ``s`` gives ``cos(g1, g2) = |s|^2 / (|s|^2 + n^2)``, so ``noise/signal = sqrt(1/cos - 1)``
  (from the same tasks: task-specific signal counts as signal there; the disjoint-task cosine is
  what generalizes).
- **Success along the gradient.** Plain steps ``theta - a * g / |g|`` of L2 length ``a`` along
  the mean of the three gradients (``a < 0``: against it), each scored by sampled success on
  ``--eval-tasks`` x ``--eval-group`` fresh episodes of other train tasks, and on fresh episodes of
  the ``--tasks`` the gradient came from, the same sampling seed at every ``a``. A step that helps
  shows as success rising with small positive ``a``; on its own tasks only, it fits them without
  generalizing.

    python research/rl_signal.py --model runs/quickstart/sft_model
    python research/rl_signal.py --model runs/quickstart/sft_model --threads 1 \\
        --model.init_args.normalizer=... --data.init_args.agent.init_args.temperature=1.0

Unknown arguments are config overrides (``--key=value``), as ``lit-agents fit`` takes them.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

from lit_agents.algorithms.collate import batches_by_tokens, collate_rows
from lit_agents.pipelines import default_config_dir
from lit_agents.pipelines.evaluate import build


def trainable(module) -> list[torch.nn.Parameter]:
    return [p for p in module.policy.parameters() if p.requires_grad]


def rollouts(cli, tasks, group: int, seed: int):
    dm = cli.datamodule
    return dm.play(tasks, group, greedy=False, seed=seed, policy=cli.model.policy, trainer=cli.trainer)


def gradient(cli, tasks, group: int, seed: int) -> tuple[torch.Tensor, dict]:
    """The flat gradient of the module's policy loss over one step of these tasks' rollouts
    (one token mean over every trained token, as a whole-group step takes it)."""
    module, dm = cli.model, cli.datamodule
    played = rollouts(cli, tasks, group, seed)
    rows = module.training_rows(played)
    params = trainable(module)
    grads = [torch.zeros_like(p) for p in params]
    tokens = sum(r.num_trained for r in rows)
    module.policy.train()
    for rows_ in batches_by_tokens(rows, dm.max_tokens_per_batch):
        batch = collate_rows(rows_, module.policy.pad_id)
        with cli.trainer.precision_plugin.forward_context():
            logp = module.policy.batch_logprobs(batch, module.temperature)
            loss = module.policy_loss(logp, batch["old_logprobs"], batch["advantages"], batch["action_mask"],
                                      normalizer=float(max(tokens, 1))).loss
        for g, d in zip(grads, torch.autograd.grad(loss, params, allow_unused=True)):
            if d is not None:
                g += d.float()
    module.policy.eval()
    info = {"success": sum(r.success for r in played) / len(played), "rows": len(rows), "tokens": tokens}
    return torch.cat([g.flatten() for g in grads]), info


def success(cli, tasks, group: int, seed: int) -> float:
    played = rollouts(cli, tasks, group, seed)
    return sum(r.success for r in played) / len(played)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the policy to measure (an SFT model folder)")
    parser.add_argument("--config", default=str(default_config_dir() / "quickstart_rl.yaml"))
    parser.add_argument("--tasks", type=int, default=48, help="train tasks per gradient")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument("--eval-group", type=int, default=8)
    parser.add_argument("--steps", default="-1,-0.3,-0.1,0,0.03,0.1,0.3,1", help="step lengths a ('' = none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    args, overrides = parser.parse_known_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cli = build([args.config], ["--trainer.logger=false", *overrides], model=args.model)
    module, dm = cli.model, cli.datamodule
    module.hparams.temperature = module.hparams.temperature or dm.agent.temperature or 1.0
    cli.trainer.strategy.connect(module)
    module.policy.to(cli.trainer.strategy.root_device)
    tasks = list(dm.env.tasks("train"))
    random.Random(args.seed).shuffle(tasks)
    n = args.tasks
    same, other, held = tasks[:n], tasks[n : 2 * n], tasks[2 * n : 2 * n + args.eval_tasks]
    started = time.perf_counter()
    g1, i1 = gradient(cli, same, args.group, seed=1)
    g2, i2 = gradient(cli, same, args.group, seed=2)
    g3, i3 = gradient(cli, other, args.group, seed=1)

    def cos(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(a @ b / (a.norm() * b.norm()).clamp(min=1e-12))

    c_same, c_other = cos(g1, g2), cos(g1, g3)
    ratio = (1 / c_same - 1) ** 0.5 if c_same > 0 else float("inf")
    print(f"rollouts: success {i1['success']:.3f} / {i2['success']:.3f} / {i3['success']:.3f}, "
          f"rows {i1['rows']}/{i2['rows']}/{i3['rows']}, trained tokens {i1['tokens']}/{i2['tokens']}/{i3['tokens']}")
    print(f"|g| = {g1.norm():.4g} / {g2.norm():.4g} / {g3.norm():.4g}")
    print(f"cos(same tasks, two seeds) = {c_same:.3f}   cos(disjoint tasks) = {c_other:.3f}   "
          f"noise/signal by norm = {ratio:.2f}")
    direction = (g1 + g2 + g3) / 3
    direction = direction / direction.norm().clamp(min=1e-12)
    params = trainable(module)
    start = [p.detach().clone() for p in params]
    norm = float(torch.cat([p.flatten() for p in start]).norm())
    print(f"|theta| (trainable) = {norm:.4g}; success on {args.eval_group} fresh episodes of {len(held)} other "
          f"tasks and of the {len(same)} tasks of g1, g2, by step length a:")
    for a in (float(x) for x in args.steps.split(",") if x):
        offset = 0
        with torch.no_grad():
            for p, p0 in zip(params, start):
                size = p.numel()
                p.copy_(p0 - a * direction[offset : offset + size].view_as(p).to(p.dtype))
                offset += size
        own = success(cli, same, args.eval_group, seed=7)
        print(f"  a = {a:+.3g}: other tasks {success(cli, held, args.eval_group, seed=7):.3f}, "
              f"the gradient's own tasks {own:.3f}", flush=True)
    with torch.no_grad():
        for p, p0 in zip(params, start):
            p.copy_(p0)
    print(f"({time.perf_counter() - started:.0f} s; model {Path(args.model)}; overrides {' '.join(overrides) or '-'})")


if __name__ == "__main__":
    main(sys.argv[1:])
