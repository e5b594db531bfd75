"""Do RAO nodes ask their subagents for more, less or exactly what their recipe needs?

How much a RAO node asks its subagents for, against what its recipe needs, on TextCraft-Synth:
each ``launch_subagent("craft K item")`` a node writes after reading ``Recipe: ... -> N out. You
have H out`` is *over* when K exceeds ceil((goal count - H) / N) x the ingredient's amount, *under*
when below it, else *exact*. Asking for more than needed spends base items the node's siblings
share, so their trees fail while the greedy subagent meets its own goal. With saved training
rollouts (``--data.init_args.save_rollouts=true``) it also prints the mean advantage the nodes that
wrote over-asking and exact requests were trained with. A second line scores every amount by the
environment's own check (`envs.textcraft_synth.check_amounts`, the expert's rule, which does not
net out held items): the share right, and how often a tree is solved when every amount in it is
right against when one is wrong. No model is loaded.

    python research/rao_asks.py <log_dir>/eval/last-val/rollouts.jsonl     # rao_trees.py's output
    python research/rao_asks.py runs/rao_recursive/version_0/rollouts/train-epoch*.jsonl
"""

from __future__ import annotations

import argparse
import math
import re
from collections import Counter, defaultdict
from pathlib import Path

from lit_agents.envs.textcraft_synth import check_amounts
from lit_agents.modules.rao import node_calls
from lit_agents.types import Rollout
from lit_agents.viewer import read_rollouts

RECIPE = re.compile(r"Recipe: (.*?) -> (\d+) (\w+)\. You have (\d+)")
ASK = re.compile(r'launch_subagent\("craft (\d+) (\w+)"\)')
AMOUNT = re.compile(r"(\d+) (\w+)")  # "2 vifuro" in a goal or a recipe's inputs


def request_needs(prompt: str, completion: str, goal: str) -> list[tuple[int, str, int | None]]:
    """Each subagent request in ``completion``, written by a node with ``goal`` (``craft 2 a, 1 b``)
    that read ``prompt``: (where its count starts in ``completion``, the count, what the recipes
    need of that ingredient). An ingredient's need sums over the recipes in the prompt whose output
    the goal names; it is None for every request where no such recipe was read."""
    wanted = {item: int(n) for n, item in AMOUNT.findall(goal or "")}
    need: Counter[str] = Counter()
    for used, made, output, have in RECIPE.findall(prompt):
        if output in wanted:
            crafts = math.ceil(max(0, wanted[output] - int(have)) / int(made))
            for n, item in AMOUNT.findall(used):
                need[item] += crafts * int(n)
    return [(m.start(1), m.group(1), need[m.group(2)] if need else None) for m in ASK.finditer(completion)]


def request_kind(count: int, need: int) -> str:
    return "over" if count > need else "under" if count < need else "exact"


def request_kinds(prompt: str, completion: str, goal: str) -> list[str]:
    """``over``/``exact``/``under`` for each subagent request in ``completion`` against its need
    (`request_needs`). [] where no recipe the goal names was read or the code asks nothing."""
    return [request_kind(int(count), need) for _, count, need in request_needs(prompt, completion, goal)
            if need is not None]


def ask_stats(trees: list[Rollout]) -> dict:
    """Request shares (%) by kind, and the mean node advantage of calls with an over-asking request
    and of calls whose requests are all exact or under (None without saved advantages)."""
    kinds: Counter[str] = Counter()
    adv: dict[str, list[float]] = defaultdict(list)
    for tree in trees:
        for session in tree.sessions:
            for call in session.calls:
                found = request_kinds(call.prompt_text, call.completion_text, session.goal)
                if not found:
                    continue
                kinds.update(found)
                if session.advantage is not None:
                    a = session.advantage
                    a = sum(a) / len(a) if isinstance(a, list) else a
                    adv["over" if "over" in found else "exact"].append(float(a))
    total = sum(kinds.values()) or 1
    out = {k: 100 * kinds[k] / total for k in ("over", "exact", "under")}
    out["requests"] = sum(kinds.values())
    for k in ("over", "exact"):
        out[f"adv_{k}"] = sum(adv[k]) / len(adv[k]) if adv[k] else None
    return out


def tree_amounts(trees: list[Rollout]) -> dict:
    """Every amount `check_amounts` verifies in ``trees`` (requests and crafts, each node's code
    checked against what it has read so far): the share right (%), and the trees whose every
    checked amount is right against those with a wrong one, with the share of each solved (%)."""
    checked, trees_by = [], {True: [], False: []}  # every amount's rightness; roots solved by all-right
    for tree in trees:
        rights = [ok for session in tree.sessions for call, _, prompt in node_calls(session)
                  for *_, ok in check_amounts(prompt, call.completion_text, session.goal)]
        checked += rights
        trees_by[all(rights)].append(bool(tree.sessions[0].success))
    pct = lambda xs: 100 * sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"amounts": len(checked), "amounts_right": pct(checked),
            "trees_all_right": len(trees_by[True]), "solved_all_right": pct(trees_by[True]),
            "trees_some_wrong": len(trees_by[False]), "solved_some_wrong": pct(trees_by[False])}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+", help="rollout JSONL files (eval or training)")
    args = parser.parse_args(argv)
    rows = []
    for path in args.files:
        trees = [tree for _, tree in read_rollouts([path])]
        stats = ask_stats(trees) | tree_amounts(trees)
        rows.append({"file": str(path), **stats})
        line = (f"{path}: {stats['requests']} requests, over {stats['over']:.1f}%, exact {stats['exact']:.1f}%, "
                f"under {stats['under']:.1f}%")
        if stats["adv_over"] is not None or stats["adv_exact"] is not None:
            fmt = lambda a: "-" if a is None else f"{a:+.3f}"  # noqa: E731
            line += f"; node advantage over {fmt(stats['adv_over'])}, exact/under {fmt(stats['adv_exact'])}"
        print(line)
        fmt = lambda a: "-" if a is None else f"{a:.0f}%"  # noqa: E731
        print(f"  {stats['amounts']} amounts checked, {fmt(stats['amounts_right'])} right; trees with every "
              f"amount right: {stats['trees_all_right']}, solved {fmt(stats['solved_all_right'])}; with a wrong "
              f"amount: {stats['trees_some_wrong']}, solved {fmt(stats['solved_some_wrong'])}")
    return rows


if __name__ == "__main__":
    main()
