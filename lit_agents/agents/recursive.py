"""RAO's recursive loop: one shared policy at every node of an execution tree it grows itself.

Each node writes Python that runs in its own sandboxed REPL (`lit_agents.envs.repl`) holding the
environment's functions for the node's state (``env.functions(state)``) plus
``await launch_subagent(goal)``: a child node of the same policy on ``goal`` (fresh context,
depth + 1, the env state forked with ``env.fork(state, goal)`` so children share the parent's
inventory), whose final answer is returned to the parent's code. Children started together
(``asyncio.gather``) run concurrently; every node waiting for the model, in every tree, is
batched into one engine call per step. A node ends when its state is done (``finish()``) or
after ``max_steps`` turns (a child's turns do not count against its parent), or when its
context window (``max_context_tokens``: the prompt, its turns, their observations) is full; a
turn writes at most the room left. Limits on depth and on nodes per tree refuse
further ``launch_subagent`` calls with an error the code can catch.

Every node is one session of the rollout (``main`` at the root, ``subagent`` below) with
``parent`` and ``depth``, its ``goal`` and its own verified ``success``; ``meta`` holds its steps
and answer. With ``recursive=False`` there is no ``launch_subagent``: the linear baseline.

Extension points for subclasses (docs/extending.md, examples/subclasses.py): `system_text`,
`node_prompt` (what a node is told), `extract_code` (the code in a completion) and `expert_code`
(the demonstrations' code).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_agents.agents.base import Agent, Cursor, env_error_session, reset_env, sample_turns, write_turn
from lit_agents.envs.base import TextEnv, expert_episodes
from lit_agents.envs.repl import LAUNCH_DOC, PythonREPL, ReplResult, ToolCall
from lit_agents.policy import AgentPolicy
from lit_agents.types import Rollout, Session, Task

_ROOM_STEP = 16  # a turn's room in the context window, in steps of this many tokens
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


@dataclass(kw_only=True)
class _Node(Cursor):
    """One node of a tree; as a cursor, its session. ``expert``: the env whose expert writes the
    node's code in a demonstration (None: the policy writes it)."""

    tree: int
    goal: str
    state: Any
    depth: int
    repl: PythonREPL
    functions: dict[str, Any]
    parent: _Node | None = None
    parent_call: int | None = None
    expert: TextEnv | None = None
    tokens: int = 0  # the node's context so far: prompts, observations, completions
    steps: int = 0
    done: bool = False
    answer: str = ""
    reason: str = ""  # why it ended: finished, max_steps or context
    waiting: dict[int, _Node] = field(default_factory=dict)


class RecursiveAgent(Agent):
    """Code-writing agents that delegate to subagents of themselves (RAO).

    Args:
        max_new_tokens: longest code block per turn (tokens).
        temperature: sampling temperature of training rollouts.
        top_p: nucleus sampling.
        max_depth: deepest node (the root is depth 0); deeper launches are refused.
        max_steps: model turns per node (a child's turns are its own).
        max_nodes: nodes per tree; further launches are refused.
        recursive: offer ``launch_subagent`` (False: the linear baseline).
        look_first: expert demonstrations (`expert_rollout`) read recipes before using them:
            a node's first turn(s) only look recipes up and the next writes the rest from
            what they showed (`TextCraftSynth.expert_turn`), instead of one block that knows
            the recipes by heart. What an agent needs for targets it never trained on.
        max_context_tokens: each node's context window: where the room left is less than
            ``max_new_tokens``, a turn writes at most that room rounded down to a multiple of
            16, and a node with less than 16 tokens of room ends there, unfinished (reason
            ``context``). None: unlimited.
        repl_timeout_s: time limit of one code block in its REPL worker's CPU seconds, so machine
            load does not change which code times out (time waiting for tools uses none).
        repl_wall_timeout_s: wall-clock backstop of one code block, for code that sleeps or
            blocks (time waiting for tools excluded).
        repl_memory_mb: address-space limit of each node's REPL process.
        repl_spawn: how a node's REPL process starts: ``"zygote"`` (forked from a warm process,
            milliseconds) or ``"exec"`` (a fresh interpreter, about 10x slower).
        repl_containment: ``"kernel"`` (the REPL's kernel sandbox; refuses to run on a machine
            lacking a layer) or ``"python-only"`` (the audit hook only, chosen by name): see
            `PythonREPL` and docs/sandbox.md.
        system_prompt: the system message; ``None`` = the env's function instructions (+ the
            subagent tool), ``""`` = none.
        show_progress: a progress bar over decode steps.
    """

    def __init__(
        self,
        max_new_tokens: int = 192,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_depth: int = 6,
        max_steps: int = 25,
        max_nodes: int = 16,
        recursive: bool = True,
        look_first: bool = False,
        max_context_tokens: int | None = None,
        repl_timeout_s: float = 10.0,
        repl_wall_timeout_s: float = 30.0,
        repl_memory_mb: int = 1024,
        repl_spawn: Literal["zygote", "exec"] = "zygote",
        repl_containment: Literal["kernel", "python-only"] = "kernel",
        system_prompt: str | None = None,
        show_progress: bool = False,
    ) -> None:
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.max_depth, self.max_steps, self.max_nodes = max_depth, max_steps, max_nodes
        self.recursive, self.look_first, self.max_context_tokens = recursive, look_first, max_context_tokens
        self.repl_timeout_s, self.repl_wall_timeout_s = repl_timeout_s, repl_wall_timeout_s
        self.repl_memory_mb, self.repl_spawn, self.repl_containment = repl_memory_mb, repl_spawn, repl_containment
        self.system_prompt, self.show_progress = system_prompt, show_progress

    # ------------------------------------------------------------------ extension points
    def system_text(self, env: TextEnv) -> str:
        """The system message of every node: ``system_prompt``, else the env's function
        instructions (plus the subagent tool when ``recursive``)."""
        if self.system_prompt is not None:
            return self.system_prompt
        return getattr(env, "function_instructions", env.instructions) + (" " + LAUNCH_DOC if self.recursive else "")

    @staticmethod
    def extract_code(completion: str) -> str:
        """The code of a completion: its fenced block(s) if any, else the whole text."""
        blocks = _FENCE.findall(completion)
        return "\n".join(blocks) if blocks else completion

    def node_prompt(self, env: TextEnv, state: Any, depth: int) -> str:
        """The first user message of a node (the root at depth 0, a subagent below), in live
        trees and demonstrations alike. Default: ``env.intro(state)`` (the node's goal and what
        it has). Override to tell a node more (its depth, its limits, its parent's goal)."""
        return env.intro(state)

    # ------------------------------------------------------------------ rollouts
    def run(
        self,
        policy: AgentPolicy,
        env: TextEnv,
        tasks: list[Task],
        group_size: int = 1,
        *,
        greedy: bool = False,
        seed: int = 0,
        group_offset: int = 0,
        policy_version: int = 0,
    ) -> list[Rollout]:
        """Grow ``group_size`` trees per task; one rollout per tree, its nodes as sessions."""
        return self._play(policy, env, tasks, group_size, greedy=greedy, seed=seed, group_offset=group_offset,
                          policy_version=policy_version)

    def _play(self, policy: AgentPolicy, env: TextEnv, tasks: list[Task], group_size: int = 1, *,
              greedy: bool = False, seed: int = 0, group_offset: int = 0, policy_version: int = 0,
              expert: bool = False) -> list[Rollout]:
        """`run`; with ``expert`` the env's expert writes every node's code (`expert_rollout`)."""
        for needed in ("functions", "fork", "intro"):
            if not hasattr(env, needed):
                raise TypeError(
                    f"RecursiveAgent needs an env with `{needed}` (e.g. TextCraftSynth), not {type(env).__name__}"
                )
        trees: list[list[_Node]] = []
        meta: list[tuple[Task, int, Exception | None]] = []
        for i, task in enumerate(tasks):
            for _ in range(group_size):
                reset = reset_env(env, task)
                failed = reset if isinstance(reset, Exception) else None
                trees.append([])
                meta.append((task, group_offset + i, failed))
                if failed is None:
                    self._new_node(policy, env, trees, len(trees) - 1, task.goal, reset[0], 0, None, None,
                                   env if expert else None)
        params = self.sampling(policy, self.max_new_tokens, greedy=greedy)
        engine, generator = self.engine(policy, seed)
        started = time.perf_counter()
        seconds = [0.0] * len(trees)  # until each tree's root finished
        concurrency = [1] * len(trees)  # most of a tree's nodes waiting on the model at once
        try:
            while ready := [n for tree in trees for n in tree if not n.done and not n.waiting]:
                if full := [n for n in ready if self._room(n) < 1]:
                    for node in full:  # may resume a parent: look again
                        self._end(
                            policy,
                            env,
                            trees,
                            node,
                            f"stopped: context window of {self.max_context_tokens} tokens full",
                            "context",
                        )
                    continue
                for t, count in Counter(n.tree for n in ready).items():
                    concurrency[t] = max(concurrency[t], count)
                texts = self.complete(policy, engine, ready, params, generator, policy_version)
                for node, text in zip(ready, texts):
                    node.steps += 1
                    node.repl.submit(self.extract_code(text))
                    self._drive(policy, env, trees, node)
                for t, tree in enumerate(trees):
                    if tree and tree[0].done and not seconds[t]:
                        seconds[t] = time.perf_counter() - started
        finally:
            for tree in trees:
                for node in tree:
                    node.repl.close()
        end = time.perf_counter() - started
        return [
            self._rollout(tree, task, group, seconds[t] or end, concurrency[t])
            if failed is None
            else self._failed_rollout(task, group, failed)
            for t, (tree, (task, group, failed)) in enumerate(zip(trees, meta))
        ]

    def complete(self, policy, engine, nodes: list[_Node], params, generator, version: int) -> list[str]:
        """One batched model call for ``nodes`` (one engine call per room left in their context
        windows: all but a few have ``max_new_tokens``); records each call in its node's
        session. In an expert tree (`expert_rollout`) the env's expert writes the code instead."""
        expert = nodes[0].expert  # a run is all expert or all policy
        if expert is not None:
            for node in nodes:
                write_turn(policy, node, f"```python\n{self.expert_code(expert, node)}```")
        else:
            by_room: dict[int, list[_Node]] = {}
            for node in nodes:
                by_room.setdefault(self._room(node), []).append(node)
            for room, batch in by_room.items():
                sample_turns(policy, engine, batch, dataclasses.replace(params, max_new_tokens=room), generator,
                             version)
        texts = []
        for node in nodes:
            call = node.session.calls[-1]
            node.tokens += len(call.prompt_ids) + len(call.completion_ids)
            texts.append(call.completion_text)
        return texts

    def _new_node(self, policy, env, trees, tree: int, goal: str, state, depth: int, parent, call_id,
                  expert: TextEnv | None) -> _Node:
        functions = env.functions(state)
        async_tools = ["launch_subagent"] if self.recursive else []
        repl = PythonREPL(tools=list(functions), async_tools=async_tools, timeout_s=self.repl_timeout_s,
                          wall_timeout_s=self.repl_wall_timeout_s, memory_mb=self.repl_memory_mb, spawn=self.repl_spawn,
                          containment=self.repl_containment)
        kind = "main" if parent is None else "subagent"
        session = Session(len(trees[tree]), kind, None if parent is None else parent.session.session_id, depth,
                          goal=goal, success=False)
        node = _Node(session=session, tree=tree, goal=goal, state=state, depth=depth, repl=repl, functions=functions,
                     parent=parent, parent_call=call_id, expert=expert)
        node.start(policy, self.system_text(env), self.node_prompt(env, state, depth))
        trees[tree].append(node)
        return node

    def _drive(self, policy, env, trees, node: _Node) -> None:
        """Run the node's code until it needs children, or ends; then prepare its next turn."""
        while True:
            step = node.repl.poll()
            if isinstance(step, ReplResult):
                self._after_code(policy, env, trees, node, step)
                return
            for call in step:
                if call.call_id in node.waiting:
                    continue
                if call.is_async:
                    self._launch(policy, env, trees, node, call)
                else:
                    node.repl.respond(call.call_id, **self._call_tool(node, call))
            if node.waiting:
                return  # blocked on children: resumed when they finish

    @staticmethod
    def _call_tool(node: _Node, call: ToolCall) -> dict[str, Any]:
        fn = node.functions.get(call.name)
        if fn is None:
            return {"error": f"NameError: no tool {call.name!r}"}
        try:
            return {"value": fn(*call.args, **call.kwargs)}
        except Exception as err:  # the env's error goes to the code
            return {"error": f"{type(err).__name__}: {err}"}

    def _launch(self, policy, env, trees, node: _Node, call: ToolCall) -> None:
        goal = str(call.args[0]) if call.args else str(call.kwargs.get("goal", ""))
        if node.depth + 1 > self.max_depth:
            node.repl.respond(call.call_id, error=f"depth limit {self.max_depth} reached: launch_subagent refused")
            return
        if len(trees[node.tree]) >= self.max_nodes:
            node.repl.respond(call.call_id, error=f"node limit {self.max_nodes} reached: launch_subagent refused")
            return
        try:
            state = env.fork(node.state, goal)
        except Exception as err:
            node.repl.respond(call.call_id, error=f"{type(err).__name__}: {err}")
            return
        child = self._new_node(policy, env, trees, node.tree, goal, state, node.depth + 1, node, call.call_id,
                               node.expert)
        node.waiting[call.call_id] = child

    def _room(self, node: _Node) -> int:
        """Tokens the node's next turn may write: ``max_new_tokens``, or where the context
        window leaves less, what it leaves rounded down to a multiple of ``_ROOM_STEP`` (0: the
        window is full)."""
        left = None if self.max_context_tokens is None else self.max_context_tokens - node.tokens - len(node.pending)
        if left is None or left >= self.max_new_tokens:
            return self.max_new_tokens
        return max(0, left // _ROOM_STEP * _ROOM_STEP)

    def _after_code(self, policy, env, trees, node: _Node, result: ReplResult) -> None:
        observation = result.observation()
        if getattr(node.state, "done", False):
            self._end(policy, env, trees, node, observation, "finished")
        elif node.steps >= self.max_steps:
            self._end(policy, env, trees, node, f"stopped after {node.steps} turns without finishing", "max_steps")
        else:
            node.follow(policy, observation)

    def _end(self, policy, env, trees, node: _Node, answer: str, reason: str) -> None:
        """Close the node; its answer goes back to its parent's code, which resumes."""
        node.done, node.answer, node.reason = True, answer, reason
        node.session.success = bool(getattr(node.state, "success", False))
        node.session.meta.update(steps=node.steps, answer=answer)
        node.repl.close()
        parent = node.parent
        if parent is not None:
            parent.waiting.pop(node.parent_call, None)
            parent.repl.respond(node.parent_call, value=answer)
            if not parent.waiting:
                self._drive(policy, env, trees, parent)

    @staticmethod
    def _rollout(tree: list[_Node], task: Task, group: int, seconds: float, concurrency: int) -> Rollout:
        root = tree[0]
        success = bool(root.session.success)
        meta = _tree_meta(task, steps=sum(n.steps for n in tree), nodes=len(tree), depth=max(n.depth for n in tree),
                          reason=root.reason, seconds=seconds, concurrency=concurrency)
        return Rollout(task.task_id, group, [n.session for n in tree], float(success), success, meta)

    @staticmethod
    def _failed_rollout(task: Task, group: int, err: Exception) -> Rollout:
        """A tree whose env failed to reset: one empty root session, no reward."""
        session = env_error_session(err, steps=0, answer="")
        session.goal, session.success = task.goal, False
        meta = _tree_meta(task, steps=0, nodes=1, depth=0, reason="env_error", seconds=0.0, concurrency=1)
        return Rollout(task.task_id, group, [session], 0.0, False, meta)

    # ------------------------------------------------------------------ demonstrations
    def expert_code(self, env: TextEnv, node: _Node) -> str:
        """The code an expert node writes: with ``launch_subagent`` the env's recursive program
        (subagents for missing crafted ingredients), else (the linear baseline) its flat one;
        with ``look_first`` the turn of it for the node's turn."""
        if self.look_first:
            return env.expert_turn(node.state, node.steps, self.recursive)
        if self.recursive:
            return env.expert_recursive_program(node.state)
        return env.expert_program(node.state.task)

    def expert_rollout(self, policy: AgentPolicy, env: TextEnv, task: Task, group_id: int = 0) -> Rollout:
        """The expert's execution tree for ``task``: every node's code by `expert_code`, run in
        the sandboxed REPLs like a live tree and tokenized as the policy would write it."""
        return self._play(policy, env, [task], 1, greedy=True, group_offset=group_id, expert=True)[0]

    def expert_episode(self, env: TextEnv, task: Task, epsilon: float = 0.0, seed: int = 0):
        """The expert's text actions as an episode (a record: `replay` grows the tree again)."""
        if epsilon:
            raise ValueError("noisy recursive demonstrations are not supported")
        return next(iter(expert_episodes(env, [task])))

    def replay(self, policy: AgentPolicy, env: TextEnv, episode, group_id: int = 0) -> Rollout:
        """A demonstration as an execution tree: the expert grows it again (`expert_rollout`)."""
        return self.expert_rollout(policy, env, episode.task, group_id)


def _tree_meta(task: Task, **meta: object) -> dict[str, object]:
    """A tree rollout's ``meta``, with the task's crafting depth as its ``difficulty`` when known."""
    if "depth" in task.meta:
        meta["difficulty"] = task.meta["depth"]
    return meta
