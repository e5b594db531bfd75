"""Aggregation: count or aggregate over every record of a long log (an Oolong stand-in).

Oolong (Bertsch et al., arXiv 2511.02817) asks distributional questions over long contexts (how
often a label occurs, which user is most frequent), so every part of the context matters and none
can be skipped. Here the context is a synthetic service log of records like
``#00042 user=Kavo team=north level=warn amount=37 msg: cache retried near disk seven``, read in
chunks, and one question per episode: how many records have ``level=warn``, the total or largest
amount of records with ``team=east``, which user occurs most (least) often, how many distinct
users occur. As in Oolong-synth a few users write most records (Zipf weights) and the levels can
be left implicit (``hide_levels``: the message's verb tells the level, e.g. ``retried`` -> warn).

Length is measured in whitespace-separated words (a record is 11 words, 10 with hidden levels):
a task's transcript has ``min_words`` to ``max_words`` words (log-uniform per task); a chunk holds
as many whole records as fit ``chunk_words``.

Choices [choice]:
    - Question language (also the goal language of ``goal_met``, ``answer_of``, ``subgoals``):
      ``How many records have f=v[ and g=w]`` | ``What is the total amount of records with f=v`` |
      ``What is the largest amount of records with f=v`` | ``Which f occurs most often`` |
      ``Which f occurs least often`` | ``How many distinct f values occur``; the last three may
      add `` among records with g=w``; two partial forms serve delegation: ``What are the counts
      of each f`` (answer ``a=3, b=1``) and ``Which distinct f values occur`` (answer ``a, b``).
      Any question may end with `` in chunks a..b`` (inclusive) to cover a chunk range only.
      Ties go to the alphabetically first value; "least often" ranks values that occur; an empty
      maximum, count list or value list is ``none``.
    - Splits: fresh transcripts per seed (train 0.., test 10000.., val 20000..). With
      ``hold_out_forms`` the test questions use held-out (kind, field) forms: each kind has one
      field (by ``(kind index + field index) % 3 == 0``) that only ``test`` asks about; ``val`` =
      train forms over unseen transcripts.
    - Questions are drawn from the transcript's sampling weights, not its records, so listing
      tasks is cheap; condition values are likely (expected count >= 3).
    - Functions (REPL interface): ``read(i) -> str``, ``num_chunks() -> int``, ``answer(text)
      -> str``; a bad argument raises ``ValueError`` with the message the text action would show.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lit_agents.envs.actions import clip, counted, error_result, verb_and_argument
from lit_agents.envs.base import Split, StepResult, Task, TextEnv

TEST_SEED_OFFSET = 10_000
VAL_SEED_OFFSET = 2 * TEST_SEED_OFFSET
FIELDS = ("user", "team", "level")
KINDS = ("count", "sum", "max", "most", "least", "distinct")
PARTIAL = {"count": "count", "sum": "sum", "max": "max", "most": "counts", "least": "counts",
           "distinct": "values", "counts": "counts", "values": "values"}
TEAMS = ("north", "south", "east", "west", "core", "edge")
CUES = {
    "debug": ("traced", "probed", "dumped", "sampled", "inspected"),
    "info": ("started", "completed", "connected", "saved", "synced"),
    "warn": ("slowed", "retried", "degraded", "throttled", "lagged"),
    "error": ("failed", "crashed", "refused", "aborted", "corrupted"),
}
NOUNS = "cache disk queue socket worker index backup session upload parser".split()
PREPS = "near after during before beside".split()
NUMBERS = "one two three four five six seven eight nine".split()
_C = r"(?P<conds>[\w-]+=[\w-]+(?: and [\w-]+=[\w-]+)*)"
_A = rf"(?: among records with {_C})?"
_F = r"(?P<field>\w+)"
PATTERNS = {
    "count": f"how many records have {_C}",
    "sum": f"what is the total amount of records with {_C}",
    "max": f"what is the largest amount of records with {_C}",
    "most": f"which {_F} occurs most often{_A}",
    "least": f"which {_F} occurs least often{_A}",
    "distinct": f"how many distinct {_F} values occur{_A}",
    "counts": f"what are the counts of each {_F}{_A}",
    "values": f"which distinct {_F} values occur{_A}",
}
_RANGE = r"(?: in chunks (?P<a>\d{1,6})\.\.(?P<b>\d{1,6}))?\s*\??"
_REGEX = {k: re.compile(p + _RANGE) for k, p in PATTERNS.items()}


@dataclass(frozen=True)
class Query:
    """A parsed question: its ``kind``, target ``field`` (most, least, distinct, counts, values),
    conditions ``conds`` ((field, value) pairs, all must hold) and inclusive ``chunks`` range."""

    kind: str
    field: str | None = None
    conds: tuple[tuple[str, str], ...] = ()
    chunks: tuple[int, int] | None = None

    @staticmethod
    def parse(text: str) -> Query:
        """The query of a question; ValueError when it is not in the question language."""
        text = " ".join(str(text).lower().split())
        for kind, regex in _REGEX.items():
            if m := regex.fullmatch(text):
                conds = tuple(tuple(c.split("=")) for c in (m["conds"] or "").split(" and ") if c)
                target = m.groupdict().get("field")
                if any(f not in FIELDS for f in [f for f, _ in conds] + [target or "user"]):
                    raise ValueError(f"fields are {', '.join(FIELDS)}: {text[:80]!r}")
                span = None if m["a"] is None else (int(m["a"]), int(m["b"]))
                return Query(kind, target, conds, span)  # type: ignore[arg-type]
        raise ValueError(f"not a question this log can answer: {text[:80]!r}")

    def text(self) -> str:
        """The question, as `parse` reads it."""
        conds = " and ".join(f"{f}={v}" for f, v in self.conds)
        head = PATTERNS[self.kind].replace(_A, f" among records with {conds}" if conds else "")
        head = head.replace(_C, conds).replace(_F, self.field or "")
        span = f" in chunks {self.chunks[0]}..{self.chunks[1]}" if self.chunks else ""
        return f"{head[0].upper()}{head[1:]}{span}?"


@dataclass
class Transcript:
    """A log as columns: ``users``, ``teams``, ``levels``, ``amounts``, ``messages``."""

    users: list[str]
    teams: list[str]
    levels: list[str]
    amounts: list[int]
    messages: list[str]

    def __len__(self) -> int:
        return len(self.users)


@dataclass
class AggregationState:
    """One episode: the ``query``, its ``truth``, the ``transcript``, records per chunk
    (``chunk_records``), chunks ``read``, ``steps``, ``done``/``success`` and the ``answer``."""

    task: Task
    query: Query
    transcript: Transcript
    chunk_records: int
    truth: str = ""
    read: set[int] = field(default_factory=set)
    steps: int = 0
    done: bool = False
    success: bool = False
    answer: str | None = None

    @property
    def num_chunks(self) -> int:
        return -(-len(self.transcript) // self.chunk_records)


def evaluate(query: Query, log: Transcript, rows: range) -> str:
    """The answer of ``query`` over the records ``rows`` of ``log``."""
    cols = {"user": log.users, "team": log.teams, "level": log.levels}
    keep = [i for i in rows if all(cols[f][i] == v for f, v in query.conds)]
    if query.kind in ("count", "sum", "max"):
        amounts = [log.amounts[i] for i in keep]
        value = {"count": len(amounts), "sum": sum(amounts), "max": max(amounts, default=None)}
        return "none" if value[query.kind] is None else str(value[query.kind])
    counts = Counter(cols[query.field][i] for i in keep)  # type: ignore[index]
    return summarize(query.kind, counts)


def summarize(kind: str, counts: Counter[str]) -> str:
    """The answer of a most/least/distinct/counts/values query from value counts."""
    if kind == "distinct":
        return str(len(counts))
    if not counts:
        return "none"
    if kind in ("most", "least"):
        sign = -1 if kind == "most" else 1
        return min(counts.items(), key=lambda kv: (sign * kv[1], kv[0]))[0]
    if kind == "counts":
        return ", ".join(f"{v}={n}" for v, n in sorted(counts.items()))
    return ", ".join(sorted(counts))


def canonical(kind: str, text: str) -> str:
    """An answer in the form compared for scoring (case, spaces, order of list items)."""
    text = " ".join(str(text).lower().split()).rstrip(".").strip()
    if kind in ("counts", "values"):
        return ",".join(sorted(x.replace(" ", "") for x in text.split(",") if x.strip()))
    return text.replace(",", "") if re.fullmatch(r"\d[\d,]*", text) else text


class Aggregation(TextEnv):
    """Aggregation: read a long log chunk by chunk and answer a counting/aggregation question.

    Args:
        min_words: fewest words of a task's log (whitespace-separated).
        max_words: most words of a task's log (log-uniform between the two per task).
        chunk_words: most words per chunk (whole records).
        users: size of the user-name pool (names from syllables, fixed by ``seed``).
        hide_levels: leave ``level=`` out of the records: the message's verb tells the level.
        hold_out_forms: test questions use (kind, field) forms that train never asks.
        seed: seed of the user names and of every task's log and question.
        train_tasks: tasks (seeds) of the ``train`` split.
        test_tasks: tasks of each of ``val`` and ``test``.
        max_steps: step limit the agent loop applies (must fit reading every chunk and answering).
    """

    instructions = (
        "Answer the question about the log by reading all of it. Actions: 'read <i>' shows "
        "chunk i; 'num_chunks' tells how many chunks there are; 'answer <text>' submits the "
        "answer and ends the episode. Answer with a number or a value; ties go to the "
        "alphabetically first value."
    )

    def __init__(
        self,
        min_words: int = 4_000,
        max_words: int = 32_000,
        chunk_words: int = 500,
        users: int = 16,
        hide_levels: bool = False,
        hold_out_forms: bool = True,
        seed: int = 0,
        train_tasks: int = 1000,
        test_tasks: int = 100,
        max_steps: int = 100,
    ) -> None:
        self.words_per_record = 10 if hide_levels else 11
        wpr = self.words_per_record
        if not wpr <= min_words <= max_words or chunk_words < wpr:
            raise ValueError(f"need {wpr} <= min_words <= max_words and chunk_words >= {wpr}")
        if not 2 <= users <= 1000 or train_tasks < 0 or not 0 <= test_tasks <= TEST_SEED_OFFSET:
            raise ValueError("need 2 <= users <= 1000, train_tasks >= 0, 0 <= test_tasks <= 10000")
        self.min_words, self.max_words, self.chunk_words = min_words, max_words, chunk_words
        self.hide_levels, self.hold_out_forms, self.seed = hide_levels, hold_out_forms, seed
        self.train_tasks, self.test_tasks, self.max_steps = train_tasks, test_tasks, max_steps
        self.chunk_records = chunk_words // self.words_per_record
        most = -(-(max_words // self.words_per_record + 1) // self.chunk_records)
        if max_steps < most + 1:
            raise ValueError(f"max_steps {max_steps} cannot read {most} chunks and answer")
        rng = random.Random(f"aggregation/users/{seed}")
        names: set[str] = set()
        while len(names) < users:  # "none" answers an empty list
            names.add("".join(rng.choice("bdgklmnprstvz") + rng.choice("aeiou") for _ in range(2)))
            names.discard("none")
        self.users = tuple(sorted(names))
        self.values = {"user": self.users, "team": TEAMS, "level": tuple(CUES)}

    def is_test_form(self, kind: str, target: str) -> bool:
        """Whether questions of this kind about this field are held out for ``test``."""
        return self.hold_out_forms and (KINDS.index(kind) + FIELDS.index(target)) % 3 == 0

    def _weights(self, seed: int) -> tuple[int, dict[str, list[float]]]:
        """A task's record count and sampling weights per field (Zipf-like over users)."""
        rng = random.Random(f"aggregation/{self.seed}/{seed}/shape")
        words = math.exp(rng.uniform(math.log(self.min_words), math.log(self.max_words)))
        ranks = list(range(1, len(self.users) + 1))
        rng.shuffle(ranks)
        weights = {"user": [r ** -1.2 for r in ranks],
                   "team": [rng.random() + 0.2 for _ in TEAMS],
                   "level": [rng.random() + 0.2 for _ in CUES]}
        weights = {f: [w / sum(ws) for w in ws] for f, ws in weights.items()}
        return max(1, round(words / self.words_per_record)), weights

    def transcript(self, seed: int) -> Transcript:
        """The log of a task seed."""
        n, weights = self._weights(seed)
        rng = random.Random(f"aggregation/{self.seed}/{seed}/records")
        cols = {f: rng.choices(self.values[f], weights[f], k=n) for f in FIELDS}
        cues = [rng.choice(CUES[level]) for level in cols["level"]]
        parts = [rng.choices(w, k=n) for w in (NOUNS, PREPS, NOUNS, NUMBERS)]
        messages = [f"{a} {c} {b} {d} {e}" for a, c, b, d, e in zip(parts[0], cues, *parts[1:])]
        amounts = [rng.randint(1, 99) for _ in range(n)]
        return Transcript(cols["user"], cols["team"], cols["level"], amounts, messages)

    def question(self, seed: int, test: bool) -> Query:
        """A task's question, drawn from the seed's sampling weights (the log is not built)."""
        n, weights = self._weights(seed)
        rng = random.Random(f"aggregation/{self.seed}/{seed}/question")
        forms = [(k, f) for k in KINDS for f in FIELDS if self.is_test_form(k, f) == test]
        forms = forms or [(k, f) for k in KINDS for f in FIELDS]
        kind, target = rng.choice(forms)

        def cond(f: str) -> tuple[tuple[str, str], float]:
            value = rng.choices(self.values[f], weights[f])[0]
            return (f, value), weights[f][self.values[f].index(value)]

        others = [f for f in FIELDS if f != target]
        if kind in ("count", "sum", "max"):
            (first, p), extra = cond(target), rng.random() < (0.3 if kind == "count" else 0.0)
            second, q = cond(rng.choice(others)) if extra else (None, 1.0)
            conds = (first, second) if second and n * p * q >= 3 else (first,)
            return Query(kind, None, conds)
        if rng.random() < 0.5:
            extra, p = cond(rng.choice(others))
            if n * p >= 3:
                return Query(kind, target, (extra,))
        return Query(kind, target)

    def tasks(self, split: Split) -> list[Task]:
        """The split's tasks, one fresh log and question per seed."""
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
        first, count = {"train": (0, self.train_tasks), "val": (VAL_SEED_OFFSET, self.test_tasks),
                        "test": (TEST_SEED_OFFSET, self.test_tasks)}[split]
        out = []
        for seed in range(first, first + count):
            query = self.question(seed, split == "test")
            n = self._weights(seed)[0]
            meta = {"kind": query.kind, "records": n, "words": n * self.words_per_record}
            out.append(Task(f"aggregation/{split}/{seed}", query.text(), seed, meta))
        return out

    def reset(self, task: Task) -> tuple[AggregationState, str]:
        """Start an episode: the log of ``task.seed`` and the question ``task.goal``."""
        state = AggregationState(task, Query.parse(task.goal), self.transcript(task.seed),
                                 self.chunk_records)
        state.truth = self.answer_of(state, task.goal)
        n = state.num_chunks
        return state, (f"Question: {task.goal}\nThe log has {n} chunks (0..{n - 1}) of up to "
                       f"{self.chunk_records} records.")

    def _rows(self, state: AggregationState, query: Query) -> range:
        if query.chunks is None:
            return range(len(state.transcript))
        a, b = query.chunks
        if not 0 <= a <= b < state.num_chunks:
            raise ValueError(f"chunks {a}..{b} are not within 0..{state.num_chunks - 1}")
        c = state.chunk_records
        return range(a * c, min((b + 1) * c, len(state.transcript)))

    def answer_of(self, state: AggregationState, goal: str) -> str:
        """The answer of a (sub)question over this episode's log: a chunk range's partial result."""
        query = Query.parse(goal)
        return evaluate(query, state.transcript, self._rows(state, query))

    def subgoals(self, state: AggregationState, span: int = 1,
                 goal: str | None = None) -> list[str]:
        """Sub-questions over consecutive ranges of ``span`` chunks whose answers `combine` into
        the answer of ``goal`` (default: the task's question)."""
        query = Query.parse(goal or state.task.goal)
        kind = PARTIAL[query.kind]
        a, b = query.chunks or (0, state.num_chunks - 1)
        return [Query(kind, query.field, query.conds, (k, min(k + span, b + 1) - 1)).text()
                for k in range(a, b + 1, max(1, span))]

    @staticmethod
    def combine(goal: str, partials: list[str]) -> str:
        """The answer of ``goal`` from its `subgoals`' answers."""
        kind = Query.parse(goal).kind
        if kind in ("count", "sum"):
            return str(sum(int(p) for p in partials))
        if kind == "max":
            return str(max((int(p) for p in partials if p != "none"), default="none"))
        counts: Counter[str] = Counter()
        for part in (p for p in partials if p.strip() != "none"):
            for item in (x.strip() for x in part.split(",") if x.strip()):
                value, _, n = item.partition("=")
                counts[value] += int(n) if n else 1
        return summarize(kind, counts)

    def check_answer(self, state: AggregationState, goal: str, text: str) -> bool:
        """Whether ``text`` answers ``goal`` on this log (e.g. a subagent's partial result)."""
        try:
            kind = Query.parse(goal).kind
            return canonical(kind, text) == canonical(kind, self.answer_of(state, goal))
        except ValueError:
            return False

    def step(self, state: AggregationState, action: str) -> StepResult:
        """Apply one action; failures come back as observations with ``info["error"]``."""
        if state.done:
            return error_result("The episode is over.")
        state.steps += 1
        text = str(action).strip()
        verb, arg = verb_and_argument(text)
        try:
            if verb == "read":
                return StepResult(self._read(state, re.sub(r"^chunk\s+", "", arg, flags=re.I)))
            if verb == "num_chunks" and not arg:
                return StepResult(f"The log has {state.num_chunks} chunks.")
            if verb == "answer":
                return self._answer(state, arg)
        except ValueError as exc:
            return error_result(str(exc))
        return error_result(f"Could not execute {clip(text)!r}: use read, num_chunks or answer.")

    def _read(self, state: AggregationState, index: Any) -> str:
        n = state.num_chunks
        if isinstance(index, bool) or not re.fullmatch(r"\d{1,9}", str(index).strip()) \
                or int(str(index).strip()) >= n:
            raise ValueError(f"No chunk {clip(str(index))!r}: read takes 0 to {n - 1}.")
        i, c, log = int(str(index).strip()), state.chunk_records, state.transcript
        state.read.add(i)
        lines = [f"#{k:05d} user={log.users[k]} team={log.teams[k]}"
                 + ("" if self.hide_levels else f" level={log.levels[k]}")
                 + f" amount={log.amounts[k]} msg: {log.messages[k]}"
                 for k in range(i * c, min((i + 1) * c, len(log)))]
        return "\n".join([f"[chunk {i}/{n - 1}]"] + lines)

    def _answer(self, state: AggregationState, text: str) -> StepResult:
        if not text.strip():
            raise ValueError("answer needs a non-empty text.")
        state.answer, state.done = text, True
        kind = state.query.kind
        state.success = canonical(kind, text) == canonical(kind, state.truth)
        verdict = "correct" if state.success else "wrong"
        return StepResult(f"Answer {clip(text)!r} is {verdict}.", float(state.success), True,
                          state.success)

    def functions(self, state: AggregationState) -> dict[str, Callable[..., Any]]:
        """``read(i)``, ``num_chunks()``, ``answer(text)`` on ``state``."""

        def read(i: int) -> str:
            """The records of chunk ``i`` (0-based), one per line."""
            return self._read(state, i)

        def num_chunks() -> int:
            """How many chunks the log has."""
            return state.num_chunks

        def answer(text: str) -> str:
            """Submit the final answer (ends the episode)."""
            return self._answer(state, str(text)).observation

        return counted(state, read, num_chunks, answer)

    def progress(self, state: AggregationState) -> float:
        """Share of the chunks read; 1 on success."""
        return 1.0 if state.success else len(state.read) / state.num_chunks

    def goal_met(self, state: AggregationState, goal: str) -> bool:
        """Whether every chunk a (sub)question covers (all without ``in chunks a..b``) is read;
        False for a goal that does not parse or whose range is out of bounds."""
        try:
            query = Query.parse(goal)
            a, b = query.chunks or (0, state.num_chunks - 1)
            self._rows(state, query)
        except ValueError:
            return False
        return all(i in state.read for i in range(a, b + 1))

    def expert_action(self, state: AggregationState) -> str:
        """Read every chunk in order (each a partial result of `subgoals`), then answer."""
        unread = [i for i in range(state.num_chunks) if i not in state.read]
        return f"read {unread[0]}" if unread else f"answer {state.truth}"

    def corpus(self) -> Iterator[str]:
        """The instructions, questions of every form, example observations and a log sample."""
        yield self.instructions
        yield "Question: The log has chunks (0..) of up to records. [chunk /] none is correct."
        yield "is wrong. The episode is over. No chunk read takes 0 to Could not execute"
        for kind in PATTERNS:
            for target in FIELDS:
                other = FIELDS[(FIELDS.index(target) + 1) % 3]
                for value in self.values[target]:
                    if kind in ("count", "sum", "max"):
                        yield Query(kind, None, ((target, value),), (0, 9)).text()
                    else:
                        yield Query(kind, target, ((other, self.values[other][0]),)).text()
        yield " ".join([w for ws in CUES.values() for w in ws] + NOUNS + PREPS + NUMBERS)
        state, first = self.reset(Task("aggregation/corpus", "Which user occurs most often?"))
        yield first
        yield self._read(state, 0)
