"""Where does RAO's node credit push, depth by depth?

Where RAO's node credit pushes: per tree depth, the nodes' own success and the advantages they
got under each baseline (``root``, the paper's, and ``depth``), from a fit run's saved training
rollouts (``--data.init_args.save_rollouts=true``). No model is loaded; the node rewards use the
run's ``lam`` and ``propagate_root``; depth weights are left out, so the numbers are the credit
itself. Each epoch's file is scored on its own (group ids restart every epoch).

    python research/rao_credit.py runs/rao_recursive/version_0 [--max-depth 4]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import yaml

from lit_agents.modules.rao import tree_node_advantages, tree_node_rewards
from lit_agents.viewer import read_rollouts


def credit_by_depth(files: list[Path], lam: float, propagate_root: bool, baseline: str, max_depth: int) -> dict:
    """``{depth: {"nodes", "success", "mean_adv", "pos", "zero"}}`` over the files' trees, depths
    from ``max_depth`` on pooled (shares in %, ``mean_adv`` per node)."""
    pools: dict[int, list[tuple[float, bool]]] = defaultdict(list)
    for f in files:
        trees = [tree for _, tree in read_rollouts([f])]
        advs = tree_node_advantages(trees, tree_node_rewards(trees, lam, propagate_root), baseline, False)
        for tree, adv in zip(trees, advs):
            for session, a in zip(tree.sessions, adv):
                pools[min(session.depth, max_depth)].append((a, bool(session.success)))
    return {
        d: {"nodes": len(v), "success": 100 * sum(ok for _, ok in v) / len(v),
            "mean_adv": sum(a for a, _ in v) / len(v), "pos": 100 * sum(a > 0 for a, _ in v) / len(v),
            "zero": 100 * sum(a == 0 for a, _ in v) / len(v)}
        for d, v in sorted(pools.items())
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir", type=Path, help="a fit run's log folder (rollouts/train-epoch*.jsonl)")
    parser.add_argument("--max-depth", type=int, default=4, help="pool the depths from this one on")
    args = parser.parse_args(argv)
    files = sorted(args.log_dir.glob("rollouts/train-epoch*-rank0.jsonl"))
    if not files:
        raise SystemExit(f"no training rollouts under {args.log_dir}/rollouts: "
                         "fit with --data.init_args.save_rollouts=true")
    hparams = yaml.safe_load((args.log_dir / "hparams.yaml").read_text()) or {}
    lam, propagate = float(hparams.get("lam", 0.4)), bool(hparams.get("propagate_root", False))
    out = {}
    print(f"{args.log_dir}: {len(files)} epochs of training trees; lam {lam}, propagate_root {propagate}")
    for baseline in ("root", "depth"):
        out[baseline] = credit_by_depth(files, lam, propagate, baseline, args.max_depth)
        print(f"baseline={baseline}")
        for d, s in out[baseline].items():
            deep = "+" if d == args.max_depth else " "
            print(f"  depth {d}{deep} nodes {s['nodes']:6d}  success {s['success']:5.1f}%  "
                  f"mean A {s['mean_adv']:+.3f}  A>0 {s['pos']:5.1f}%  A=0 {s['zero']:5.1f}%")
    return out


if __name__ == "__main__":
    main()
