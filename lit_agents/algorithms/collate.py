"""Training rows: sessions and demonstrations as token rows, and their batching.

One row per context window (docs/architecture.md, Data model): an append-only session becomes one ``Row`` holding
exactly the sampled token ids, with ``action_mask`` True on the generated tokens, the sampler's
log-probs and the session's advantage on those tokens. Supervised demonstrations are rows too,
with ``action_mask`` on the target tokens. ``collate_rows`` pads rows into tensors (wrapped in a
``Batch``, what a module's ``training_step`` gets);
``group_steps`` splits an epoch's rows into optimizer steps of whole groups (every row of
each task's G rollouts in one step, so each step's advantages are those of complete groups);
``batches_by_tokens`` cuts a step's rows into micro-batches under a token budget (by length, or a
task's G rows together where their shared prompt saves more; joined by gradient accumulation). ``pack_rows`` and
``collate_packed`` instead put several rows end to end in one sequence with positions restarting
at each row, which Hugging Face models turn into attention kept within each row (varlen kernels
under flash attention; a block-diagonal mask otherwise).

Alignment: index ``t`` of every per-token list or tensor describes token ``t``. The loss at token
``t`` uses ``log p(token_t | tokens_<t)``, which ``losses.token_logprobs`` places at index ``t``.
Nothing predicts token 0, so ``action_mask[0]`` is always False.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import Tensor

from lit_agents.types import Rollout, Session

__all__ = [
    "Row",
    "Batch",
    "segments_row",
    "demo_row",
    "session_row",
    "session_rows",
    "record_advantages",
    "sequence_mean_rows",
    "transition_rows",
    "collate_rows",
    "batches_by_tokens",
    "batch_positions",
    "row_orders",
    "shared_prefix_plan",
    "group_steps",
    "pack_rows",
    "packs_by_tokens",
    "collate_packed",
]


@dataclass
class Row:
    """One training row: a token sequence and per-token training data (all lists same length).

    Attributes:
        input_ids: the tokens.
        action_mask: True on trained tokens (generated tokens; SFT targets). False at index 0.
        old_logprobs: the sampler's log-prob of each trained token, 0.0 elsewhere.
        advantages: the advantage of each trained token, 0.0 elsewhere.
        role: the adapter (role) that trains on this row.
        meta: where the row came from (rollout index, session id, kind, depth, truncated, ...).
        trainer_logprobs: the trainer's log-prob of each trained token under the weights that
            sampled it (recomputed after the rollout: `GRPOPolicy.add_trainer_logprobs`), 0.0
            elsewhere; None where not recomputed. Differs from ``old_logprobs`` where the sampling
            engine computes otherwise than the trainer (vLLM's kernels, precision).
    """

    input_ids: list[int]
    action_mask: list[bool]
    old_logprobs: list[float]
    advantages: list[float]
    role: str = "default"
    meta: dict[str, Any] = field(default_factory=dict)
    trainer_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        lengths = (len(self.action_mask), len(self.old_logprobs), len(self.advantages))
        if self.trainer_logprobs is not None:
            lengths += (len(self.trainer_logprobs),)
        if any(length != n for length in lengths):
            raise ValueError(
                f"Row lists differ in length: input_ids {n}, action_mask/old_logprobs/advantages "
                f"{lengths}"
            )
        if n and self.action_mask[0]:
            raise ValueError("action_mask[0] must be False: nothing predicts the first token")

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_trained(self) -> int:
        return sum(self.action_mask)


@dataclass
class Batch:
    """A micro-batch as a module's ``training_step`` receives it, in one of three forms (``kind``):

    - ``"rows"``: ``tensors`` holds the collated rows (`collate_rows` or `collate_packed` with
      ``meta``): ``input_ids``, ``attention_mask``, ``action_mask``, ``old_logprobs``,
      ``advantages``, ``meta``, and ``position_ids`` when packed;
    - ``"empty"`` (`Batch.empty`): no rows on any rank (no group of the epoch has a learning
      signal): the module skips the update;
    - ``"pad"`` (`Batch.pad`): under DDP this rank has no rows left while another still steps: the
      module takes a zero-gradient step through the same path, so the gradient all-reduces match.

    ``step_tokens``: under gradient accumulation or DDP, the trained tokens of the whole optimizer
    step this micro-batch is one of ``accumulate`` parts of, summed over the ``world`` ranks
    (`AgentModule.loss_normalizer` divides by it, so a step is one token mean over its
    micro-batches and ranks); None with neither. A KL anchor
    (`callbacks.KLAnchor`) fills the reference: ``ref_logprobs`` (``[B, T]``, the reference's
    log-prob of each token) or, for the exact vocabulary KL, ``ref_hidden`` (``[B, T, H]``) and
    ``ref_head`` (its output layer's weight and bias).
    """

    tensors: dict[str, Any] = field(default_factory=dict)
    kind: Literal["rows", "empty", "pad"] = "rows"
    step_tokens: int | None = None
    accumulate: int = 1
    world: int = 1
    ref_logprobs: Tensor | None = None
    ref_hidden: Tensor | None = None
    ref_head: tuple[Tensor, Tensor | None] | None = None

    def __post_init__(self) -> None:
        if (self.kind == "rows") != bool(self.tensors):
            raise ValueError(f"a {self.kind!r} batch {'needs' if self.kind == 'rows' else 'has no'} tensors")

    @classmethod
    def empty(cls) -> Batch:
        return cls(kind="empty")

    @classmethod
    def pad(cls) -> Batch:
        return cls(kind="pad")

    @property
    def has_rows(self) -> bool:
        return self.kind == "rows"

    def __len__(self) -> int:
        """Sequences in the batch (rows, or packs when packed); 0 for the empty and pad forms."""
        return len(self.tensors["input_ids"]) if self.has_rows else 0


def segments_row(
    segments: list[tuple[list[int], bool]],
    role: str = "default",
    meta: dict[str, Any] | None = None,
) -> Row:
    """A supervised row from ``(ids, trained)`` segments, e.g. a multi-turn demonstration.

    Args:
        segments: token segments in order; ``trained`` marks target segments.
        role: the adapter that trains on the row.
        meta: extra row metadata.

    Returns:
        A ``Row`` with ``action_mask`` on the target segments and zero logprobs/advantages.
    """
    ids: list[int] = []
    mask: list[bool] = []
    for seg_ids, trained in segments:
        ids += list(seg_ids)
        mask += [bool(trained)] * len(seg_ids)
    if mask and mask[0]:
        raise ValueError("a demonstration must start with at least one untrained (prompt) token")
    zeros = [0.0] * len(ids)
    return Row(ids, mask, zeros, list(zeros), role=role, meta=dict(meta or {}))


def demo_row(
    prompt_ids: list[int],
    target_ids: list[int],
    role: str = "default",
    meta: dict[str, Any] | None = None,
) -> Row:
    """A supervised row: ``prompt_ids + target_ids`` with the loss on the target only.

    Args:
        prompt_ids: the context (non-empty).
        target_ids: the tokens to learn.
        role: the adapter that trains on the row.
        meta: extra row metadata.

    Returns:
        A ``Row``.
    """
    return segments_row([(prompt_ids, False), (target_ids, True)], role=role, meta=meta)


def session_row(session: Session, advantage: float | list[float], max_tokens: int | None = None) -> Row | None:
    """One session as a row, its advantage on its generated tokens (one for the whole session, or
    one per call: each call's completion tokens get their call's).

    The row holds ``Session.token_ids``; tokens past ``max_tokens`` are dropped (the prefix is
    kept) and ``meta["truncated"]`` says so. A generated token at index 0 (a session whose first
    call has an empty prompt) cannot be trained and is masked out.

    Args:
        session: an append-only session.
        advantage: the session's advantage.
        max_tokens: keep at most this many tokens.

    Returns:
        The row, or None when it has no trainable generated token.
    """
    ids, mask, logps = session.token_ids, session.action_mask, session.sampler_logprobs
    truncated = max_tokens is not None and len(ids) > max_tokens
    if truncated:
        ids, mask, logps = ids[:max_tokens], mask[:max_tokens], logps[:max_tokens]
    if mask:
        mask[0] = False
    if not any(mask):
        return None
    meta = {
        "session_id": session.session_id,
        "kind": session.kind,
        "depth": session.depth,
        "truncated": truncated,
        "tokens_dropped": session.num_tokens - len(ids),
    }
    role = session.calls[0].role
    if isinstance(advantage, (int, float)):
        per_token = [float(advantage)] * len(ids)
    elif len(advantage) == len(session.calls):
        per_token = [float(a) for call, a in zip(session.calls, advantage)
                     for a in [0.0] * len(call.prompt_ids) + [a] * len(call.completion_ids)]
    else:
        raise ValueError(f"session {session.session_id} has {len(session.calls)} calls but {len(advantage)} advantages")
    advantages = [a if m else 0.0 for a, m in zip(per_token, mask)]
    logps = [lp if m else 0.0 for lp, m in zip(logps, mask)]
    return Row(ids, mask, logps, advantages, role=role, meta=meta)


def session_rows(
    rollouts: list[Rollout],
    session_advantages: list[list[float | list[float]]],
    max_tokens: int | None = None,
    keep: list[bool] | None = None,
) -> list[Row]:
    """One row per session with generated tokens, over a batch of rollouts.

    ``session_advantages[i][k]`` is copied to the generated tokens of ``rollouts[i].sessions[k]``;
    a list there gives each call of the session its own advantage (`session_row`).
    Sessions with no generated token (also after truncation) give no row. Each row's ``meta``
    holds ``rollout`` (index into ``rollouts``), ``group_id``, ``task_id``, ``session_id``,
    ``kind``, ``depth``, ``truncated``, ``tokens_dropped``, ``session`` (index into the rollout's
    sessions) and ``advantage`` (the session's; the mean of its calls' where each has its own);
    its role is the first call's role (a session is assumed to have one role). The rollouts are
    not modified (`record_advantages` copies the advantages onto the sessions).

    Args:
        rollouts: the rollouts.
        session_advantages: one advantage per session of each rollout.
        max_tokens: truncate longer rows at the right to this many tokens.
        keep: per rollout, whether it gives rows (a zero-signal filter); None keeps all. Filter
            here rather than by passing fewer rollouts: ``meta["rollout"]`` then still indexes
            the batch that `record_advantages` writes back into.

    Returns:
        The rows, in rollout then session order.
    """
    if len(session_advantages) != len(rollouts):
        raise ValueError(
            f"{len(rollouts)} rollouts but {len(session_advantages)} advantage lists"
        )
    if max_tokens is not None and max_tokens < 2:
        raise ValueError(f"max_tokens must be at least 2, got {max_tokens}")
    if keep is not None and len(keep) != len(rollouts):
        raise ValueError(f"{len(rollouts)} rollouts but {len(keep)} keep flags")
    rows: list[Row] = []
    for i, (rollout, advs) in enumerate(zip(rollouts, session_advantages)):
        if keep is not None and not keep[i]:
            continue
        if len(advs) != len(rollout.sessions):
            raise ValueError(
                f"rollout {i} has {len(rollout.sessions)} sessions but {len(advs)} advantages"
            )
        for k, (session, adv) in enumerate(zip(rollout.sessions, advs)):
            row = session_row(session, adv, max_tokens) if session.num_generated else None
            if row is not None:
                mean = float(adv) if isinstance(adv, (int, float)) else sum(adv) / max(len(adv), 1)
                row.meta.update(rollout=i, session=k, advantage=mean, group_id=rollout.group_id,
                                task_id=rollout.task_id)
                rows.append(row)
    return rows


def record_advantages(rollouts: list[Rollout], rows: list[Row]) -> None:
    """Set ``Session.advantage`` of every session a row of `session_rows` trains (rows whose
    ``meta`` names their ``rollout``, ``session`` and ``advantage``; other rows are skipped):
    what the saved rollouts and the viewer show. Sessions without a row keep None."""
    for row in rows:
        meta = row.meta
        if {"rollout", "session", "advantage"} <= meta.keys():
            rollouts[meta["rollout"]].sessions[meta["session"]].advantage = meta["advantage"]


def sequence_mean_rows(rows: list[Row]) -> list[Row]:
    """Rows reweighted so that the token-mean loss over them weighs every row alike, whatever its
    length: each row's advantages times (the rows' mean trained tokens / its trained tokens). Under
    PPO-clip and CISPO, which are linear in a positive advantage scale, the token mean then equals
    the mean over rows of each row's own token mean (the sequence mean of the original GRPO, TRL's
    ``loss_type="grpo"``) when a step holds all of ``rows``, and approximates it for a step that
    holds part of them. ``meta["advantage"]`` (what the viewer shows) is left as it was; the KL
    term stays a token mean. Returns new rows."""
    trained = [row.num_trained for row in rows]
    counted = [n for n in trained if n]
    if not counted:
        return list(rows)
    mean = sum(counted) / len(counted)
    return [row if not n else replace(row, advantages=[a * mean / n for a in row.advantages])
            for row, n in zip(rows, trained)]


def transition_rows(rollouts: list[Rollout], role: str) -> list[Row]:
    """One row per session of ``role`` that records per-call transitions (Multi2's executor).

    Such sessions hold ``meta["rewards"]`` and ``meta["dones"]``, one per call (see
    `agents.hierarchical`). The row's ``meta`` gets ``spans`` (``[start, end)`` token span of each
    call's completion), ``rewards``, ``dones``, ``met`` (the subgoal was met: the session's
    ``success``) and ``rollout``.
    """
    rows = []
    for i, rollout in enumerate(rollouts):
        for session in rollout.sessions:
            rewards = session.meta.get("rewards")
            if session.meta.get("role") != role or not session.calls or rewards is None:
                continue
            row = session_row(session, 0.0)
            if row is None:
                continue
            spans, at = [], 0
            for call in session.calls:
                at += len(call.prompt_ids)
                spans.append((at, at + len(call.completion_ids)))
                at += len(call.completion_ids)
            row.meta.update(rollout=i, group_id=rollout.group_id, task_id=rollout.task_id, spans=spans,
                            rewards=list(rewards), dones=list(session.meta["dones"]), met=bool(session.success))
            rows.append(row)
    return rows


def collate_rows(rows: list[Row], pad_id: int, with_meta: bool = False) -> dict[str, Tensor]:
    """Right-pad rows into a batch.

    Args:
        rows: the rows (at least one).
        pad_id: token id for padding (its positions have ``attention_mask`` 0).

    Returns:
        ``input_ids [B, T]`` long, ``attention_mask [B, T]`` long, ``action_mask [B, T]`` bool,
        ``old_logprobs [B, T]`` float32, ``advantages [B, T]`` float32, where ``T`` is the
        longest row; padding is 0 / False everywhere except ``input_ids`` (``pad_id``). Where
        every row has them, also ``trainer_logprobs [B, T]`` float32. With ``with_meta``, also
        ``meta``: the rows' ``meta`` dicts (for per-row data such as spans).
    """
    if not rows:
        raise ValueError("collate_rows needs at least one row")
    B, T = len(rows), max(row.num_tokens for row in rows)
    batch = {
        "input_ids": torch.full((B, T), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros((B, T), dtype=torch.long),
        "action_mask": torch.zeros((B, T), dtype=torch.bool),
        "old_logprobs": torch.zeros((B, T), dtype=torch.float32),
        "advantages": torch.zeros((B, T), dtype=torch.float32),
    }
    for b, row in enumerate(rows):
        n = row.num_tokens
        if n and row.action_mask[0]:
            raise ValueError(f"row {b}: action_mask[0] must be False")
        batch["input_ids"][b, :n] = torch.tensor(row.input_ids, dtype=torch.long)
        batch["attention_mask"][b, :n] = 1
        batch["action_mask"][b, :n] = torch.tensor(row.action_mask, dtype=torch.bool)
        batch["old_logprobs"][b, :n] = torch.tensor(row.old_logprobs, dtype=torch.float32)
        batch["advantages"][b, :n] = torch.tensor(row.advantages, dtype=torch.float32)
    if all(row.trainer_logprobs is not None for row in rows):
        batch["trainer_logprobs"] = torch.zeros((B, T), dtype=torch.float32)
        for b, row in enumerate(rows):
            batch["trainer_logprobs"][b, : row.num_tokens] = torch.tensor(row.trainer_logprobs, dtype=torch.float32)
    if with_meta:
        batch["meta"] = [row.meta for row in rows]
    return batch


#: shortest prefix worth sharing, in tokens (`AgentPolicy(share_prefix=True)`)
MIN_SHARED_PREFIX = 16

PrefixPlan = tuple[list[tuple[int, int]], list[int], list[int]]


def shared_prefix_plan(ids: list[list[int]], lengths: list[int], first_needed: list[int],
                       min_shared: int = MIN_SHARED_PREFIX) -> PrefixPlan | None:
    """Which rows of a right-padded batch share which prefix, as `AgentPolicy` runs them (one pass
    over each shared prefix, then every row's own tokens against it).

    Rows whose first ``min_shared`` tokens agree share their common tokens, up to before the
    first position whose hidden state a row needs (``first_needed``: the one predicting its
    first trained token), keeping at least one token of their own.

    Returns:
        ``(prefixes, row_prefix, row_start)``: each prefix a (representative row, length), each
        row its prefix's index (-1: none) and where its own tokens start (0 without a prefix);
        None where no prefix is shared or sharing saves under 10% of the batch's padded positions
        (`plan_positions`).
    """
    limits = [min(f, n - 1) for f, n in zip(first_needed, lengths)]  # a row keeps >= 1 own token
    clusters: dict[tuple[int, ...], list[int]] = {}
    for r, limit in enumerate(limits):
        if limit >= min_shared:
            clusters.setdefault(tuple(ids[r][:min_shared]), []).append(r)
    prefixes, row_prefix, row_start = [], [-1] * len(ids), [0] * len(ids)
    for rows in clusters.values():
        if len(rows) < 2:
            continue
        rep_ids, length = ids[rows[0]], min(limits[r] for r in rows)
        for r in rows[1:]:
            same = 0
            while same < length and ids[r][same] == rep_ids[same]:
                same += 1
            length = same
        if length >= min_shared:
            for r in rows:
                row_prefix[r], row_start[r] = len(prefixes), length
            prefixes.append((rows[0], length))
    if not prefixes:
        return None
    plan = (prefixes, row_prefix, row_start)
    return plan if plan_positions(lengths, plan) < 0.9 * len(ids) * max(lengths) else None


def plan_positions(lengths: list[int], plan: PrefixPlan | None) -> int:
    """Positions a forward pass runs over a right-padded batch: ``rows x longest`` without a plan;
    with one, the prefix pass (prefixes x longest prefix) plus the suffix pass (rows x longest
    own part)."""
    if plan is None:
        return len(lengths) * max(lengths, default=0)
    prefixes, _, row_start = plan
    return len(prefixes) * max(p for _, p in prefixes) + len(lengths) * max(n - s for n, s in zip(lengths, row_start))


def batch_positions(rows: list[Row], share_prefix: bool = True) -> int:
    """`plan_positions` of a micro-batch of rows: what its forward pass costs, in positions."""
    lengths = [row.num_tokens for row in rows]
    if not share_prefix or len(rows) < 2:
        return plan_positions(lengths, None)
    first_needed = [next((t - 1 for t, m in enumerate(row.action_mask) if m), row.num_tokens) for row in rows]
    return plan_positions(lengths, shared_prefix_plan([row.input_ids for row in rows], lengths, first_needed))


def row_orders(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    """Two orders to cut micro-batches from: every row longest first (least padding), and a task's
    rows together (the same ``meta["group_id"]``: groups by their longest row, each group's rows
    longest first), where a batch holds whole groups, or a run of one, whose shared prompt runs
    once. Ties keep input order; rows without a group id are groups of one."""
    by_length = sorted(range(len(rows)), key=lambda i: (-rows[i].num_tokens, i))
    groups: dict[Any, list[int]] = {}
    for i in by_length:
        groups.setdefault(rows[i].meta.get("group_id", ("row", i)), []).append(i)
    by_group = [i for members in groups.values() for i in members]  # groups meet in order of their longest
    return [rows[i] for i in by_length], [rows[i] for i in by_group]


def batches_by_tokens(rows: list[Row], max_tokens_per_batch: int, share_prefix: bool = False,
                      by_length: bool = True) -> list[list[Row]]:
    """Group rows into batches whose padded size ``len(batch) * longest`` fits a token budget.

    Rows are taken longest first and filled greedily, so rows of similar length share a batch
    and padding stays small. With ``share_prefix`` (the policy runs a batch's shared prompts
    once: `AgentPolicy(share_prefix=True)`) the same greedy fill also runs over a task's rows
    kept together (`row_orders`), and the batching whose forward passes cost fewer positions
    (`batch_positions`) wins: on SmolLM2's 5-turn TextCraft rows, whose ~110-token prompt is a
    quarter of a row, keeping tasks together was 13% faster in micro-batches of 4; on the quick
    start's, whose G rows differ more in length than their prompt saves, length order was
    1.3-1.6x faster, and the count of positions predicted both (docs/performance.md). A row
    longer than the budget goes alone into its own batch. Every row appears exactly once; the
    result is deterministic.

    Args:
        rows: the rows.
        max_tokens_per_batch: budget on ``batch_size * padded_length``.
        share_prefix: whether the policy shares prefixes within a batch.
        by_length: False cuts the batches from ``rows`` in the order given instead (more
            padding): for a module whose every micro-batch is an optimizer step with a loss
            normalised over the batch, where a batch of rows of one length would be a step of
            one kind of data (in agent data, length follows quality and outcome).

    Returns:
        The batches.
    """
    if max_tokens_per_batch < 1:
        raise ValueError(f"max_tokens_per_batch must be positive, got {max_tokens_per_batch}")
    if not by_length:
        return _fill(rows, max_tokens_per_batch)
    by_length, by_group = row_orders(rows)
    best = _fill(by_length, max_tokens_per_batch)
    if share_prefix:
        grouped = _fill(by_group, max_tokens_per_batch)
        if sum(map(batch_positions, grouped)) < sum(map(batch_positions, best)):
            best = grouped
    return best


def _fill(rows: list[Row], budget: int) -> list[list[Row]]:
    """Cut ``rows``, in order, into batches of padded size ``len(batch) * longest <= budget``."""
    batches: list[list[Row]] = []
    current: list[Row] = []
    longest = 0
    for row in rows:
        if current and (len(current) + 1) * max(longest, row.num_tokens) > budget:
            batches.append(current)
            current, longest = [], 0
        current.append(row)
        longest = max(longest, row.num_tokens)
    if current:
        batches.append(current)
    return batches


def group_steps(rows: list[Row], mini_batches: int, rng: random.Random | None = None) -> list[list[Row]]:
    """Split an epoch's rows into at most ``mini_batches`` optimizer steps of whole groups.

    A group is every row whose ``meta["group_id"]`` is the same (the G rollouts of one task with
    all their sessions or tree nodes); no group is split across steps, so each step's advantages
    are those of complete groups and hold both signs wherever a group does. Groups are put in a
    random order (``rng``; input order without one), then cut into ``mini_batches`` contiguous
    runs of about equal trained tokens; with fewer groups than ``mini_batches``, one group a
    step. Never sort an epoch's rows by length into steps: in agent RL failures run longer, so
    such steps hold one advantage sign each (docs/algorithms.md, GRPO as built here).

    Args:
        rows: the epoch's rows; each ``meta`` holds ``group_id`` (rows without one form a group
            each).
        mini_batches: the most steps to make (>= 1).
        rng: shuffles the groups.

    Returns:
        The steps, each a list of rows (rows of a group in input order); every row exactly once.
    """
    if mini_batches < 1:
        raise ValueError(f"mini_batches must be at least 1, got {mini_batches}")
    groups: dict[Any, list[Row]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row.meta.get("group_id", ("row", i)), []).append(row)
    order = list(groups.values())
    if rng is not None:
        rng.shuffle(order)
    steps = min(mini_batches, len(order))
    total = sum(row.num_trained for group in order for row in group)
    out: list[list[Row]] = [[] for _ in range(steps)]
    done, step = 0, 0
    for k, group in enumerate(order):
        # the step in whose share of the tokens this group's middle falls, moving on one step at
        # a time, and soon enough that the groups left fill every step left
        size = sum(row.num_trained for row in group)
        share = min(int((done + size / 2) * steps / max(total, 1)), steps - 1)
        step = max(min(share, step + 1 if out[step] else step), steps - (len(order) - k))
        out[step] += group
        done += size
    return out


def pack_rows(rows: list[Row], pack_length: int) -> list[list[Row]]:
    """Put rows end to end into packs of at most ``pack_length`` tokens (first fit, longest first).

    A row longer than ``pack_length`` gets a pack of its own. Deterministic; every row appears
    exactly once, and each pack lists its rows in the order they sit in the sequence.
    """
    if pack_length < 1:
        raise ValueError(f"pack_length must be positive, got {pack_length}")
    packs: list[list[Row]] = []
    room: list[int] = []
    for i in sorted(range(len(rows)), key=lambda i: (-rows[i].num_tokens, i)):
        n = rows[i].num_tokens
        slot = next((j for j, free in enumerate(room) if free >= n), None)
        if slot is None:
            packs.append([rows[i]])
            room.append(max(pack_length - n, 0))
        else:
            packs[slot].append(rows[i])
            room[slot] -= n
    return packs


def packs_by_tokens(
    rows: list[Row], max_tokens_per_batch: int, pack_length: int | None = None
) -> list[list[list[Row]]]:
    """Pack rows (`pack_rows`) and group the packs into batches of ``max_tokens_per_batch`` tokens.

    Args:
        rows: the rows.
        max_tokens_per_batch: budget on ``packs_per_batch * pack_length``.
        pack_length: tokens per pack; ``None`` = the longest row. Attention runs over whole packs,
            so without a varlen kernel (flash attention) its cost grows with the pack length.

    Returns:
        The batches, each a list of packs.
    """
    if not rows:
        return []
    length = pack_length or max(row.num_tokens for row in rows)
    packs = pack_rows(rows, length)
    per_batch = max(1, max_tokens_per_batch // length)
    return [packs[i : i + per_batch] for i in range(0, len(packs), per_batch)]


def collate_packed(packs: list[list[Row]], pad_id: int, with_meta: bool = False) -> dict[str, Tensor]:
    """Collate packs (lists of rows put end to end) into a batch.

    Returns the tensors of `collate_rows`, one sequence per pack, plus ``position_ids [P, T]``:
    positions restart at 0 at each row (pads at the end of a pack get 0), which is what tells a
    Hugging Face model to keep attention within each row. With ``with_meta``, ``meta`` holds one
    dict per row with ``pack`` and ``offset`` (where the row starts) added.
    """
    flat = [Row(
        input_ids=[t for row in pack for t in row.input_ids],
        action_mask=[m for row in pack for m in row.action_mask],
        old_logprobs=[lp for row in pack for lp in row.old_logprobs],
        advantages=[a for row in pack for a in row.advantages],
        trainer_logprobs=None if any(row.trainer_logprobs is None for row in pack)
        else [lp for row in pack for lp in row.trainer_logprobs],
    ) for pack in packs]
    batch = collate_rows(flat, pad_id)
    positions = torch.zeros_like(batch["input_ids"])
    for p, pack in enumerate(packs):
        offset = 0
        for row in pack:
            positions[p, offset : offset + row.num_tokens] = torch.arange(row.num_tokens)
            offset += row.num_tokens
    batch["position_ids"] = positions
    if with_meta:
        batch["meta"] = [
            {**row.meta, "pack": p, "offset": sum(r.num_tokens for r in pack[:k])}
            for p, pack in enumerate(packs) for k, row in enumerate(pack)
        ]
    return batch
