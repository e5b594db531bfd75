"""Saved rollouts as one self-contained HTML page, and the session layout TensorBoard pictures share.

    lit-agents view runs/x/version_0/rollouts/train-epoch0003-rank0.jsonl --out page.html
    lit-agents view runs/x/version_0/rollouts/val-*.jsonl --limit 200

The page lists the rollouts (task, group, success, reward, sessions; filter and sort), draws the
selected rollout's sessions as an SVG graph (`layout`: a compaction chain left to right, forked
subagents and child nodes below their parent) and shows a clicked session's turns: each call's
prompt and completion, the session's reward and advantage (``Session.advantage``, which
`algorithms.collate.record_advantages` sets on training rollouts). Everything is inline (CSS,
vanilla JS, SVG, the rollouts as JSON): the file opens offline, from disk, in any browser.
Rollouts come from ``save_rollouts: true`` (`data.rollouts.AgentDataModule`); docs/viewer.md.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import sys
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from lit_agents.types import SESSION_OUTCOME_FIELDS, Rollout, Session

#: node colors by session kind (the page, the TensorBoard picture)
KIND_COLORS = {"main": "#3566c4", "compaction": "#c77c12", "subagent": "#7b48c4"}
OTHER_COLOR = "#5f6b7a"


def layout(sessions: Sequence[Session]) -> dict[int, tuple[float, float]]:
    """Where each session goes in a picture of its rollout, in grid units (x right, y down).

    Sessions without a parent (the root and the compaction sessions that continue it, or the
    planner/executor sessions of a hierarchical agent) are the top row, left to right in session
    order. Every other session sits one row below its parent; a parent is centred over its
    children and each leaf takes its own column, so subtrees never overlap.

    Args:
        sessions: a rollout's sessions (``parent`` refers to a ``session_id``; a parent that is
            missing, or a cycle, makes a session a top-row one).

    Returns:
        ``{session_id: (x, y)}`` with ``x`` a column (half-integer over an even number of
        children) and ``y`` the row, 0 for the top row.
    """
    ordered = sorted(sessions, key=lambda s: s.session_id)
    ids = {s.session_id for s in ordered}
    children: dict[int, list[Session]] = {}
    for s in ordered:
        if s.parent is not None and s.parent in ids and s.parent != s.session_id:
            children.setdefault(s.parent, []).append(s)
    pos: dict[int, tuple[float, float]] = {}
    column = 0

    def place(session: Session, row: int) -> float:
        nonlocal column
        pos[session.session_id] = (0.0, row)  # placed: a cycle back here stops
        xs = [place(child, row + 1) for child in children.get(session.session_id, []) if child.session_id not in pos]
        if xs:
            x = (xs[0] + xs[-1]) / 2
        else:
            x, column = float(column), column + 1
        pos[session.session_id] = (x, row)
        return x

    for s in ordered:  # roots first, then anything a cycle left unplaced
        if s.session_id not in pos and (s.parent is None or s.parent not in ids or s.parent == s.session_id):
            place(s, 0)
    for s in ordered:
        if s.session_id not in pos:
            place(s, 0)
    return pos


def edges(sessions: Sequence[Session]) -> list[tuple[int, int, str]]:
    """The graph's edges ``(from, to, kind)``: ``child`` from a parent to each session it
    started (a fork, a launched node), ``next`` between consecutive top-row sessions (a
    compaction continues the session before it)."""
    ids = {s.session_id for s in sessions}
    out, previous = [], None
    for s in sorted(sessions, key=lambda s: s.session_id):
        if s.parent is not None and s.parent in ids and s.parent != s.session_id:
            out.append((s.parent, s.session_id, "child"))
        else:
            if previous is not None:
                out.append((previous, s.session_id, "next"))
            previous = s.session_id
    return out


def node_label(session: Session) -> tuple[str, str]:
    """Two lines naming a session in a picture: ``#id kind`` and ``d<depth> r<reward> A<advantage>``."""
    parts = [f"d{session.depth}"]
    if session.reward is not None:
        parts.append(f"r {session.reward:.2f}")
    if session.advantage is not None:
        parts.append(f"A {session.advantage:+.2f}")
    return f"#{session.session_id} {session.kind}", " · ".join(parts)


def read_rollouts(paths: Sequence[str | Path], limit: int | None = None,
                  skipped: list[str] | None = None) -> list[tuple[str, Rollout]]:
    """Rollouts from JSONL files (one ``Rollout.to_dict()`` per line), with ``file:line`` of each.

    Args:
        paths: the files, read in order.
        limit: stop after this many rollouts (``None``: all).
        skipped: where given, a line that is not a saved rollout (a run killed mid-write leaves
            half a line) is skipped and its ``file:line: reason`` appended here; else it raises.

    Returns:
        ``(source, rollout)`` pairs.
    """
    out: list[tuple[str, Rollout]] = []
    for path in map(Path, paths):
        with path.open() as f:
            for number, line in enumerate(f, 1):
                if limit is not None and len(out) >= limit:
                    return out
                if not line.strip():
                    continue
                try:
                    rollout = Rollout.from_dict(json.loads(line))
                except (ValueError, TypeError, KeyError) as error:
                    if skipped is None:
                        raise ValueError(f"{path}:{number}: not a saved rollout ({error})") from error
                    skipped.append(f"{path}:{number}: not a saved rollout ({error})")
                    continue
                out.append((f"{path.name}:{number}", rollout))
    return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _session_data(session: Session, pos: tuple[float, float]) -> dict[str, Any]:
    typed = {k: getattr(session, k) for k in SESSION_OUTCOME_FIELDS if getattr(session, k) not in (None, "")}
    meta = {**typed, **session.meta}
    return {
        "id": session.session_id, "kind": session.kind, "parent": session.parent, "depth": session.depth,
        "reward": session.reward, "advantage": session.advantage, "meta": meta,
        "x": pos[0], "y": pos[1], "tokens": session.num_tokens, "generated": session.num_generated,
        "calls": [{"prompt": c.prompt_text, "completion": c.completion_text, "role": c.role,
                   "version": c.policy_version, "prompt_tokens": len(c.prompt_ids),
                   "completion_tokens": len(c.completion_ids), "logprob": _mean(c.logprobs)}
                  for c in session.calls],
    }


def rollout_data(rollout: Rollout, source: str = "") -> dict[str, Any]:
    """What the page shows of one rollout (texts, rewards, advantages, layout; no token ids)."""
    pos = layout(rollout.sessions)
    return {
        "task": rollout.task_id, "group": rollout.group_id, "success": rollout.success,
        "reward": rollout.reward, "meta": rollout.meta, "source": source, "turns": rollout.num_turns,
        "sessions": [_session_data(s, pos[s.session_id]) for s in rollout.sessions],
        "edges": edges(rollout.sessions),
    }


def _finite(data: Any) -> Any:
    """``data`` with NaN and infinities as ``None`` (JSON has neither) and tuples as lists."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {str(k): _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def _script_json(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` survives
    unescaped, so no text can close the tag or open a comment."""
    text = json.dumps(_finite(data), ensure_ascii=False, default=str, allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render_html(rollouts: Sequence[Rollout], title: str = "rollouts", sources: Sequence[str] | None = None) -> str:
    """One self-contained HTML page showing ``rollouts`` (see the module docstring).

    Args:
        rollouts: the rollouts.
        title: the page title.
        sources: where each rollout came from (shown beside it), e.g. ``file.jsonl:12``.

    Returns:
        The page.
    """
    sources = list(sources) if sources is not None else [""] * len(rollouts)
    if len(sources) != len(rollouts):
        raise ValueError(f"{len(rollouts)} rollouts but {len(sources)} sources")
    data = {"title": title, "colors": KIND_COLORS, "other_color": OTHER_COLOR,
            "rollouts": [rollout_data(r, s) for r, s in zip(rollouts, sources)]}
    page = files("lit_agents").joinpath("viewer.html").read_text(encoding="utf-8")
    fill = {"__TITLE__": html.escape(title), "__DATA__": _script_json(data)}
    return re.sub("__TITLE__|__DATA__", lambda m: fill[m.group(0)], page)  # one pass: data is not re-read


def main(argv: list[str] | None = None) -> None:
    """``lit-agents view``: write saved rollouts as one HTML page and print its path."""
    parser = argparse.ArgumentParser(prog="lit-agents view", description=main.__doc__)
    parser.add_argument("paths", nargs="+", help="rollout JSONL files or folders of them (<log_dir>/rollouts)")
    parser.add_argument("--out", help="the HTML file (default: the first file's name with .html)")
    parser.add_argument("--limit", type=int, default=None, help="show the first N rollouts only")
    parser.add_argument("--strict", action="store_true", help="stop at a line that is not a saved rollout "
                                                               "(default: skip it and say how many were skipped)")
    args = parser.parse_args(argv)
    # a folder stands for its JSONL files (e.g. <log_dir>/rollouts)
    paths = [f for p in map(Path, args.paths) for f in (sorted(p.glob("*.jsonl")) if p.is_dir() else [p])]
    if not paths:
        parser.error(f"no .jsonl files in {' '.join(args.paths)}")
    args.paths = [str(p) for p in paths]
    skipped: list[str] = []
    try:
        pairs = read_rollouts(args.paths, args.limit, None if args.strict else skipped)
    except ValueError as error:
        parser.error(f"{error} (without --strict such lines are skipped)")
    if skipped:
        print(f"skipped {len(skipped)} line(s) that are not saved rollouts, e.g. {skipped[0]}", file=sys.stderr)
    if not pairs:
        parser.error(f"no rollouts in {' '.join(args.paths)}")
    out = Path(args.out) if args.out else Path(args.paths[0]).with_suffix(".html")
    title = Path(args.paths[0]).name + (f" (+{len(args.paths) - 1} files)" if len(args.paths) > 1 else "")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html([r for _, r in pairs], title, [s for s, _ in pairs]), encoding="utf-8")
    print(out)
