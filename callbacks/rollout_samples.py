"""RolloutSamples: what the agent did, in TensorBoard's TEXT and IMAGES tabs.

At the start of each training epoch (after the data module played the epoch's rollouts and the
module turned them into rows, so trained sessions carry their ``advantage``) it logs, on rank zero:

- ``rollout/samples`` (TEXT): a few rollouts as markdown, session by session and turn by turn
  (prompts and completions truncated): the one with the most sessions, then one of the other
  outcome (a success beside a failure), then the next largest;
- ``rollout/graph`` (IMAGES): the largest rollout's session graph or execution tree, drawn with
  matplotlib (Agg) on the same `lit_agents.viewer.layout` as the ``lit-agents view`` page.

It writes through Lightning's `TensorBoardLogger` and does nothing under other loggers. For every
rollout of a run use ``save_rollouts: true`` and ``lit-agents view`` (docs/viewer.md).
"""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from lit_agents.modules.base import training_rollouts
from lit_agents.types import Rollout, Session
from lit_agents.viewer import KIND_COLORS, OTHER_COLOR, edges, layout, node_label


def pick_samples(rollouts: list[Rollout], count: int) -> list[Rollout]:
    """Up to ``count`` rollouts worth reading: the most sessions first (ties: the earliest),
    then the largest of the other outcome, then the next largest."""
    order = sorted(range(len(rollouts)), key=lambda i: (-len(rollouts[i].sessions), i))
    picked = order[:1]
    if picked:
        other = next((i for i in order if rollouts[i].success != rollouts[picked[0]].success), None)
        if other is not None:
            picked.append(other)
    picked += [i for i in order if i not in picked]
    return [rollouts[i] for i in picked[: max(count, 0)]]


def clip(text: str, max_chars: int) -> str:
    """``text`` cut to about ``max_chars``: its start and end around a ``[... N chars ...]`` mark."""
    if len(text) <= max_chars:
        return text
    half = max(max_chars // 2, 1)
    return f"{text[:half]}\n[... {len(text) - 2 * half} chars ...]\n{text[-half:]}"


def _block(text: str) -> str:
    """An indented markdown code block (safe for any text, backticks included)."""
    return "\n".join("    " + line for line in (text or "(empty)").splitlines() or [""])


def _session_markdown(session: Session, max_chars: int, max_turns: int) -> list[str]:
    first, stats = node_label(session)
    head = f"**session {first}** · {stats}"
    if session.parent is not None:
        head += f" · started by #{session.parent}"
    if session.goal:
        head += f" · goal: `{session.goal}`"
    lines = [head]
    calls = session.calls[:max_turns]
    for k, call in enumerate(calls, 1):
        lines += [f"*turn {k} prompt:*", _block(clip(call.prompt_text, max_chars)),
                  f"*turn {k} completion:*", _block(clip(call.completion_text, max_chars))]
    if len(session.calls) > len(calls):
        lines.append(f"*... {len(session.calls) - len(calls)} more turns*")
    return lines


def rollout_markdown(rollout: Rollout, max_chars: int = 400, max_turns: int = 4, max_sessions: int = 6) -> str:
    """One rollout as markdown for TensorBoard's text tab: a header line, then each session's
    turns (at most ``max_turns`` per session, ``max_sessions`` sessions, ``max_chars`` per text)."""
    outcome = "solved" if rollout.success else "failed"
    lines = [f"### `{rollout.task_id}` · group {rollout.group_id} · **{outcome}** · reward {rollout.reward:.2f} · "
             f"{len(rollout.sessions)} sessions · {rollout.num_turns} turns"]
    for session in rollout.sessions[:max_sessions]:
        lines += _session_markdown(session, max_chars, max_turns)
    if len(rollout.sessions) > max_sessions:
        lines.append(f"*... {len(rollout.sessions) - max_sessions} more sessions*")
    return "\n\n".join(lines)


def session_figure(rollout: Rollout):
    """The rollout's sessions as a matplotlib figure (Agg canvas, no pyplot): boxes at
    `viewer.layout` positions colored by kind, outlined green/red where the session's
    ``success`` says, arrows parent -> child (solid) and session -> next session (dashed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch, Patch

    box_w, box_h = 0.8, 0.34  # in grid units (one column, one row)
    pos = layout(rollout.sessions)
    width = max((x for x, _ in pos.values()), default=0) + 1
    height = max((y for _, y in pos.values()), default=0) + 1
    inches = min(2.0 * width + 0.4, 24.0)
    fig = Figure(figsize=(inches, min(1.2 * height + 1.0, 14.0)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xlim(-0.5, width - 0.5)
    ax.set_ylim(height - 0.45, -0.55)  # row 0 on top
    ax.axis("off")
    for a, b, kind in edges(rollout.sessions):
        (xa, ya), (xb, yb) = pos[a], pos[b]
        start, end = (
            ((xa + box_w / 2, ya), (xb - box_w / 2, yb))
            if kind == "next"
            else ((xa, ya + box_h / 2), (xb, yb - box_h / 2))
        )
        ax.annotate(
            "",
            xy=end,
            xytext=start,
            arrowprops={
                "arrowstyle": "-|>",
                "color": "#8a94a3",
                "lw": 1.2,
                "shrinkA": 0,
                "shrinkB": 1,
                "linestyle": "--" if kind == "next" else "-",
            },
        )
    fontsize = 8 * min(1.0, inches / (2.0 * width + 0.4))
    crowded = fontsize < 5.5  # a wide tree squeezed into the figure: ids only
    for session in rollout.sessions:
        (x, y), success = pos[session.session_id], session.success
        edge = ("#1a7f37" if success else "#c9252d") if isinstance(success, bool) else "none"
        ax.add_patch(
            FancyBboxPatch(
                (x - box_w / 2, y - box_h / 2),
                box_w,
                box_h,
                boxstyle="round,pad=0,rounding_size=0.06",
                fc=KIND_COLORS.get(session.kind, OTHER_COLOR),
                ec=edge,
                lw=2,
            )
        )
        label = f"#{session.session_id}" if crowded else "\n".join(node_label(session))
        ax.text(
            x, y, label, ha="center", va="center", fontsize=max(fontsize, 6) if crowded else fontsize, color="white"
        )
    kinds = sorted({s.kind for s in rollout.sessions})
    ax.legend(handles=[Patch(color=KIND_COLORS.get(k, OTHER_COLOR), label=k) for k in kinds],
              loc="lower right", fontsize=7, frameon=False, ncol=len(kinds))
    outcome = "solved" if rollout.success else "failed"
    ax.set_title(f"{rollout.task_id} · {outcome} · reward {rollout.reward:.2f} · {len(rollout.sessions)} sessions",
                 fontsize=9)
    fig.tight_layout()
    return fig


class RolloutSamples(Callback):
    """Log sample training rollouts (``rollout/samples``, text) and one session graph
    (``rollout/graph``, image) to TensorBoard each epoch; rank zero, TensorBoard loggers only.

    Args:
        samples: rollouts shown as text each epoch.
        max_chars: characters kept of each prompt and completion (start and end).
        max_turns: turns shown per session.
        max_sessions: sessions shown per rollout.
        every_n_epochs: log every n-th epoch.
        graph: also log the picture.
    """

    def __init__(self, samples: int = 2, max_chars: int = 400, max_turns: int = 4, max_sessions: int = 6,
                 every_n_epochs: int = 1, graph: bool = True) -> None:
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be at least 1, got {every_n_epochs}")
        self.samples, self.max_chars, self.max_turns = samples, max_chars, max_turns
        self.max_sessions, self.every_n_epochs, self.graph = max_sessions, every_n_epochs, graph

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero or trainer.current_epoch % self.every_n_epochs:
            return
        writers = [logger.experiment for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
        rollouts = training_rollouts(pl_module)
        picked = pick_samples(rollouts, self.samples)
        if not writers or not picked:
            return
        text = "\n\n---\n\n".join(
            rollout_markdown(r, self.max_chars, self.max_turns, self.max_sessions) for r in picked
        )
        figure = session_figure(picked[0]) if self.graph else None
        for writer in writers:
            writer.add_text("rollout/samples", text, trainer.global_step)
            if figure is not None:
                writer.add_figure("rollout/graph", figure, trainer.global_step, close=False)
