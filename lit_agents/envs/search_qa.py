"""SearchQA: multi-hop question answering over a synthetic corpus (a BrowseComp/DeepDive stand-in).

BrowseComp (Wei et al., arXiv 2504.12516) and DeepDive (arXiv 2509.10446) need a live web or a
large knowledge graph; this is an offline stand-in with the same shape: a question that chains
2-6 lookups, a lexical search engine over a corpus far larger than a small context, documents
that must be opened to read the facts, and one exact answer.

The world (seeded by ``world_seed``): people, places and organisations with names built from
syllables (many share a given or family name, and organisations often borrow a place's name, so
searches return namesakes); each has attributes (a person's profession and birth year, ...) and
relations to other entities (mentor, employer, birthplace, founder, headquarters, mayor, partner
city). Each entity has one document (its facts among filler sentences that mention other entities
and distractor years); ``distractor_docs`` chronicles mention several entities at once.

A question names an anchor entity and chains relations to a final attribute or relation:
``What is the industry of the employer of the mentor of Kalo Venri?`` needs the documents of Kalo
Venri, of his mentor and of the mentor's employer: its hop count is its number of evidence
documents. Answers are checked after normalization (case, punctuation, articles, spaces).

Choices [choice]:
    - Search: BM25 (k1 1.2, b 0.75) over lowercase alphanumeric tokens, the title counted
      ``title_weight`` times; a query equal to a title (normalized) ranks that document first.
      Results show the doc id, title and the document's lead sentence, cut at ``snippet_words``
      words (it names the entity's kind or a chronicle's cast, never a fact).
    - Splits: entities are held out by a SHA-256 hash of the name (``test_fraction``). ``train``
      and ``val`` chains use only held-in entities (every evidence document and an entity answer);
      a question goes to ``val`` by a hash of its text (1 in 8): held-out questions over the same
      documents. ``test`` chains end at a held-out entity (its document holds the answer), so no
      test answer fact is ever read on a train expert path. Splits are disjoint by question.
    - Goal language (``goal_met``, ``check_answer``): a question, or ``find the <label> of ... of
      <name>``; met when every evidence document of that chain has been opened.
    - Functions (REPL interface): ``search(query, k=None) -> [{doc_id, title, snippet}]``,
      ``open(doc_id) -> str``, ``answer(text) -> str``; a bad argument raises ``ValueError`` with
      the message the text action would show. Every call or action counts as a step.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lit_agents.envs.actions import (
    MAX_ACTION_CHARS,
    clip,
    counted,
    error_result,
    verb_and_argument,
)
from lit_agents.envs.base import Split, StepResult, Task, TextEnv
from lit_agents.envs.search_world import (
    ATTRIBUTES,
    RELATIONS,
    Chain,
    hash01,
    load_world,
    normalize,
    tokens,
)

TEST_SEED_OFFSET = 10_000
VAL_SEED_OFFSET = 2 * TEST_SEED_OFFSET
VAL_SHARE = 1 / 8
_QUESTION = re.compile(r"(?:find|what is|who is)\s+the\s+(.+?)\s*\??", re.I | re.S)


@dataclass
class SearchQAState:
    """One episode: the resolved ``chain``, the doc ids ``shown`` by searches and ``opened``
    (in order), the ``queries`` made, ``steps``, ``done``/``success`` and the ``answer`` given."""

    task: Task
    chain: Chain
    shown: set[str] = field(default_factory=set)
    opened: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    steps: int = 0
    done: bool = False
    success: bool = False
    answer: str | None = None


class SearchQA(TextEnv):
    """SearchQA: answer a multi-hop question by searching and opening documents.

    Args:
        min_hops: fewest evidence documents a question needs (>= 1).
        max_hops: most evidence documents a question needs.
        entities: people, places and organisations in the world (half, a quarter, a quarter).
        distractor_docs: chronicle documents that mention several entities each.
        doc_words: about how many words a document has (facts plus filler).
        top_k: results per search.
        snippet_words: most words of a document's lead sentence shown per search result.
        title_weight: how many times a title's tokens count in the search index.
        world_seed: seed of the world (entities, facts, documents) and of the question streams.
        test_fraction: share of entities held out (test questions end at one of them).
        train_questions: questions of the ``train`` split.
        test_questions: questions of each of ``val`` and ``test``.
        max_steps: step limit the agent loop applies to an episode.
    """

    instructions = (
        "Answer the question by searching a document collection. Actions: 'search <query>' "
        "lists matching documents (id, title, lead sentence); 'open <doc id>' shows a document; "
        "'answer <text>' submits the final answer and ends the episode."
    )

    def __init__(
        self,
        min_hops: int = 2,
        max_hops: int = 6,
        entities: int = 600,
        distractor_docs: int = 200,
        doc_words: int = 120,
        top_k: int = 5,
        snippet_words: int = 12,
        title_weight: int = 3,
        world_seed: int = 0,
        test_fraction: float = 0.2,
        train_questions: int = 1000,
        test_questions: int = 100,
        max_steps: int = 30,
    ) -> None:
        if not 1 <= min_hops <= max_hops <= 12:
            raise ValueError(f"need 1 <= min_hops <= max_hops <= 12, got {min_hops}, {max_hops}")
        if entities < 20 or distractor_docs < 0 or doc_words < 8:
            raise ValueError("need entities >= 20, distractor_docs >= 0, doc_words >= 8")
        if top_k < 1 or snippet_words < 1 or title_weight < 1 or max_steps < 1:
            raise ValueError("need top_k, snippet_words, title_weight, max_steps >= 1")
        if not 0.0 < test_fraction < 1.0 or train_questions < 0 or test_questions < 0:
            raise ValueError("need 0 < test_fraction < 1 and question counts >= 0")
        self.min_hops, self.max_hops, self.entities = min_hops, max_hops, entities
        self.distractor_docs, self.doc_words, self.top_k = distractor_docs, doc_words, top_k
        self.snippet_words, self.title_weight = snippet_words, title_weight
        self.world_seed = world_seed
        self.test_fraction, self.max_steps = test_fraction, max_steps
        self.train_questions, self.test_questions = train_questions, test_questions
        self._setup()

    def _setup(self) -> None:
        self.world = load_world(self.world_seed, self.entities, self.distractor_docs,
                                self.doc_words, self.title_weight, self.test_fraction)
        self._tasks: dict[str, list[Task]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("world", "_tasks")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def tasks(self, split: Split) -> list[Task]:
        """The split's questions in generation order (hops drawn uniformly per question)."""
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
        if not self._tasks:
            self._make_tasks()
        return list(self._tasks[split])

    def _make_tasks(self) -> None:
        wanted = {"train": self.train_questions, "val": self.test_questions,
                  "test": self.test_questions}
        out: dict[str, list[Task]] = {"train": [], "val": [], "test": []}
        offset = {"train": 0, "val": VAL_SEED_OFFSET, "test": TEST_SEED_OFFSET}
        for test in (False, True):
            rng = random.Random(f"search_qa/{self.world_seed}/{'test' if test else 'train'}")
            seen: set[str] = set()
            stall = 0  # walks since the last question kept
            while any(len(out[s]) < wanted[s] for s in (["test"] if test else ["train", "val"])):
                stall += 1
                if stall > 5000:
                    raise ValueError("SearchQA: the world is too small for these questions")
                chain = self.world.walk(rng, rng.randint(self.min_hops, self.max_hops), test)
                if chain is None or chain.question in seen:
                    continue
                seen.add(chain.question)
                split = "test" if test else "val" if hash01(chain.question) < VAL_SHARE else "train"
                if len(out[split]) < wanted[split]:
                    stall, k = 0, len(out[split])
                    meta = {"hops": len(chain.docs), "answer": chain.answer}
                    out[split].append(Task(f"search_qa/{split}/{k}", chain.question,
                                           offset[split] + k, meta))
        self._tasks = out

    def resolve(self, question: str) -> Chain:
        """The chain of a question (or a ``find the ... of <name>`` goal); ValueError if invalid."""
        m = _QUESTION.fullmatch(" ".join(str(question).split()))
        if m is None:
            raise ValueError(f"not a question of the form 'What is the <label> of <name>?': "
                             f"{clip(str(question))}")
        *outer, last = re.split(r"\s+of\s+the\s+", m[1], flags=re.I)
        label, *name = re.split(r"\s+of\s+", last, maxsplit=1, flags=re.I)
        anchor = self.world.by_name.get(normalize(name[0])) if name else None
        if anchor is None:
            raise ValueError(f"unknown entity {clip(' '.join(name))!r}")
        return self.world.chain(anchor, [s.lower() for s in reversed(outer + [label])])

    def reset(self, task: Task) -> tuple[SearchQAState, str]:
        """Start an episode on ``task.goal`` (any question that resolves in this world)."""
        return SearchQAState(task, self.resolve(task.goal)), f"Question: {task.goal}"

    def step(self, state: SearchQAState, action: str) -> StepResult:
        """Apply one action; failures come back as observations with ``info["error"]``."""
        if state.done:
            return error_result("The episode is over.")
        state.steps += 1
        text = str(action).strip()
        verb, arg = verb_and_argument(text)
        try:
            if verb == "search":
                hits = self._search(state, arg, self.top_k)
                lines = [f"[{h['doc_id']}] {h['title']}: {h['snippet']}" for h in hits]
                return StepResult("\n".join([f"Results for '{clip(arg)}':"] + lines)
                                  if lines else f"No results for '{clip(arg)}'.")
            if verb == "open":
                return StepResult(self._open(state, arg))
            if verb == "answer":
                return self._answer(state, arg)
        except ValueError as exc:
            return error_result(str(exc))
        return error_result(f"Could not execute {clip(text)!r}: use search, open or answer.")

    def _search(self, state: SearchQAState, query: str, k: int) -> list[dict[str, str]]:
        query = " ".join(str(query).split())
        if not tokens(query) or len(query) > MAX_ACTION_CHARS:
            raise ValueError("search needs a query of letters or digits (at most 500 chars).")
        state.queries.append(query)
        hits = []
        for doc_id in self.world.search(query, max(1, int(k))):
            state.shown.add(doc_id)
            title, text = self.world.docs[doc_id]
            lead = text.split(". ")[0].split()  # the lead sentence: no fact
            snippet = " ".join(lead[: self.snippet_words])
            hits.append({"doc_id": doc_id, "title": title,
                         "snippet": snippet + (" ..." if len(lead) > self.snippet_words else ".")})
        return hits

    def _open(self, state: SearchQAState, doc_id: str) -> str:
        doc_id = str(doc_id).strip().strip("'\"[]").lower()
        if doc_id not in self.world.docs:
            raise ValueError(f"No document {clip(doc_id)!r}: open takes an id like d00042.")
        if doc_id not in state.opened:
            state.opened.append(doc_id)
        title, text = self.world.docs[doc_id]
        return f"[{doc_id}] {title}\n{text}"

    def _answer(self, state: SearchQAState, text: str) -> StepResult:
        if not normalize(text):
            raise ValueError("answer needs a non-empty text.")
        state.answer, state.done = text, True
        state.success = normalize(text) == normalize(state.chain.answer)
        verdict = "correct" if state.success else "wrong"
        return StepResult(f"Answer {clip(text)!r} is {verdict}.", float(state.success), True,
                          state.success)

    def functions(self, state: SearchQAState) -> dict[str, Callable[..., Any]]:
        """``search(query, k=None)``, ``open(doc_id)``, ``answer(text)`` on ``state``."""

        def search(query: str, k: int | None = None) -> list[dict[str, str]]:
            """Top-k documents for a query: [{'doc_id', 'title', 'snippet'}]."""
            return self._search(state, query, self.top_k if k is None else k)

        def open(doc_id: str) -> str:  # noqa: A001 - the tool's name
            """The full text of a document."""
            return self._open(state, doc_id)

        def answer(text: str) -> str:
            """Submit the final answer (ends the episode)."""
            return self._answer(state, text).observation

        return counted(state, search, open, answer)

    def evidence(self, chain: Chain) -> list[str]:
        """Doc ids of a chain's evidence documents, in reading order."""
        return [self.world.entities[i].doc_id for i in chain.docs]

    def progress(self, state: SearchQAState) -> float:
        """Share of the evidence documents opened; 1 on success."""
        if state.success:
            return 1.0
        docs = set(self.evidence(state.chain))
        return len(docs & set(state.opened)) / len(docs)

    def goal_met(self, state: SearchQAState, goal: str) -> bool:
        """Whether every evidence document of ``goal`` (a question or ``find the <label> of ...
        of <name>``) is opened; False for a goal that does not resolve."""
        try:
            return set(self.evidence(self.resolve(goal))) <= set(state.opened)
        except ValueError:
            return False

    def check_answer(self, goal: str, text: str) -> bool:
        """Whether ``text`` answers ``goal`` (e.g. a subagent's returned answer)."""
        try:
            return normalize(text) == normalize(self.resolve(goal).answer) != ""
        except ValueError:
            return False

    def expert_action(self, state: SearchQAState) -> str:
        """Follow the evidence: search each next entity's name until its document is listed,
        open it, then answer (the name is read off the previous document)."""
        for i, doc_id in zip(state.chain.docs, self.evidence(state.chain)):
            if doc_id not in state.opened:
                return f"open {doc_id}" if doc_id in state.shown else \
                    f"search {self.world.entities[i].name}"
        return f"answer {state.chain.answer}"

    def corpus(self) -> Iterator[str]:
        """The instructions, example observations and questions, and every document."""
        yield self.instructions
        yield "Question: What is the Who is the find the ? The episode is over. No results for"
        yield "Results for '': [d00042] ... is correct. is wrong. No document Could not execute"
        for kind in RELATIONS:
            yield " ".join(label for label, *_ in RELATIONS[kind] + ATTRIBUTES[kind])
        for task in self.tasks("train")[:200]:
            yield f"Question: {task.goal}\nanswer {task.meta['answer']}"
        for doc_id, (title, text) in self.world.docs.items():
            yield f"[{doc_id}] {title}\n{text}\nsearch {title}\nopen {doc_id}"
