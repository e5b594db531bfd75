"""What the REPL's per-execution CPU clock costs: ``PythonREPL`` reading its worker's CPU time
from ``/proc`` at each submit and each wait in ``poll`` (the limit ``timeout_s`` counts CPU
seconds), against the wall clock alone (the limit before; here the CPU reading switched off),
side by side in one run (alternating rounds, medians), on two workloads:

- tool-call round trips: one execution making ``--calls`` synchronous tool calls;
- RAO's expert execution trees on TextCraft-Synth (a new REPL per node, a few executions each).

    python benchmarks/repl_clock.py [--calls 500] [--tasks 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import contextmanager

os.environ.setdefault("OMP_NUM_THREADS", "1")

from repl_start import expert_trees, expert_workload  # noqa: E402  (a sibling: benchmarks/ is on the path when run)

from lit_agents.envs.repl import PythonREPL  # noqa: E402

CLOCKS = ("cpu clock", "wall clock only")


@contextmanager
def clock(name: str):
    """``"wall clock only"``: the worker's CPU time reads as unknown, so poll never looks at it."""
    read = PythonREPL._cpu_seconds
    if name == "wall clock only":
        PythonREPL._cpu_seconds = lambda self: None
    try:
        yield
    finally:
        PythonREPL._cpu_seconds = read


def round_trips(calls: int) -> float:
    """Seconds per synchronous tool call, in one execution."""
    with PythonREPL(tools=["craft"]) as repl:
        start = time.perf_counter()
        result = repl.run(f"for i in range({calls}):\n    craft(i)", lambda name, args, kwargs: args[0])
        assert result.error is None, result.error
        return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500, help="tool calls in the round-trip workload")
    parser.add_argument("--tasks", type=int, default=4, help="train tasks per round (expert trees)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    policy, env, tasks = expert_workload()
    round_trips(10)  # the zygote's own start is paid once per trainer process
    calls = {c: [] for c in CLOCKS}
    trees = {c: [] for c in CLOCKS}
    nodes = 0
    for r in range(args.rounds):
        for name in CLOCKS if r % 2 == 0 else CLOCKS[::-1]:
            with clock(name):
                calls[name].append(round_trips(args.calls))
                seconds, nodes = expert_trees(("zygote", "kernel"), policy, env, tasks[: args.tasks])
                trees[name].append(seconds)
    cc, wc = (statistics.median(calls[c]) for c in CLOCKS)
    ct, wt = (statistics.median(trees[c]) for c in CLOCKS)
    print(f"| workload (median of {args.rounds} rounds) | CPU clock | wall clock only | CPU / wall only |\n"
          "|---|---|---|---|")
    print(f"| one synchronous tool call ({args.calls} in one execution) | {cc * 1e6:.0f} us | {wc * 1e6:.0f} us | "
          f"{cc / wc:.2f}x |")
    print(f"| expert trees, {args.tasks} tasks ({nodes} nodes) | {ct:.2f} s | {wt:.2f} s | {ct / wt:.2f}x |")


if __name__ == "__main__":
    main()
