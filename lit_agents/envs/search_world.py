"""The synthetic world behind `SearchQA`: entities, their documents, a BM25 index, question chains.

Everything is built from a seed: people, places and organisations named from syllables (given and
family names are shared, organisations often borrow a place's name), their attributes and
relations, one document per entity (its facts shuffled among filler sentences that mention other
entities, namesakes and distractor years) and ``distractor_docs`` chronicles about three entities.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

# kind -> [(label, object kind, sentence)]; labels never contain " of "
RELATIONS: dict[str, list[tuple[str, str, str]]] = {
    "person": [
        ("mentor", "person", "{s} studied under {o}."),
        ("employer", "organisation", "{s} works for {o}."),
        ("birthplace", "place", "{s} was born in {o}."),
    ],
    "organisation": [
        ("founder", "person", "{s} was founded by {o}."),
        ("headquarters", "place", "{s} is headquartered in {o}."),
    ],
    "place": [
        ("mayor", "person", "The mayor of {s} is {o}."),
        ("partner city", "place", "{s} has a partnership with {o}."),
    ],
}
PROFESSIONS = "cartographer glassblower archivist botanist surveyor weaver clockmaker brewer " \
    "astronomer locksmith potter translator engraver beekeeper".split()
INDUSTRIES = "shipbuilding textiles printing mining insurance ceramics logistics tanning " \
    "brewing cartography glassware milling".split()
EXPORTS = "copper amber salt timber wool saffron tin marble linen honey granite indigo".split()
# kind -> [(label, values or (low, high) years, sentence)]
ATTRIBUTES: dict[str, list[tuple[str, Any, str]]] = {
    "person": [
        ("profession", PROFESSIONS, "{s} works as a {v}."),
        ("birth year", (1850, 1999), "{s} was born in the year {v}."),
    ],
    "organisation": [
        ("industry", INDUSTRIES, "{s} is active in {v}."),
        ("founding year", (1700, 1990), "{s} was established in {v}."),
    ],
    "place": [
        ("main export", EXPORTS, "The main export of {s} is {v}."),
        ("founding year", (1100, 1900), "{s} was settled in {v}."),
    ],
}
FILLER = [
    "In {y}, {s} appeared in a chronicle alongside {o}.",
    "{s} is sometimes confused with {o}.",
    "A letter dated {y} mentions {s} and {o}.",
    "{s} was the subject of a short essay in {y}.",
    "Travellers often compare {s} with {o}.",
    "Records from {y} list {s} among {n} others.",
    "Little is known about the early years of {s}.",
    "A portrait of {s} hangs in a gallery near {o}.",
]
ORG_KINDS = "Guild Institute Company Society Works Trust Foundry Press Collective Bank".split()
_ONSETS = "b d f g k l m n p r s t v z br dr kr tr st th sh".split()
_VOWELS = "a e i o u ai ei ou".split()
_CODAS = ["", "", "", "n", "r", "l", "s"]
_K1, _B = 1.2, 0.75


def normalize(text: str) -> str:
    """Lowercase, drop punctuation and articles, collapse spaces: the answer-matching form."""
    words = re.findall(r"[a-z0-9]+", str(text).lower())
    return " ".join(w for w in words if w not in ("the", "a", "an"))


def tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def hash01(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


@dataclass
class Entity:
    """A person, place or organisation: its document id, attribute values and relation targets."""

    name: str
    kind: str
    doc_id: str = ""
    attributes: dict[str, str] = field(default_factory=dict)
    relations: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Chain:
    """A resolved question: ``docs[i]`` is the entity whose document holds lookup ``labels[i]``
    (innermost first: ``labels[0]`` is looked up on the anchor ``docs[0]``)."""

    question: str
    docs: tuple[int, ...]
    labels: tuple[str, ...]
    answer: str


class World:
    """The entities, their documents and a BM25 index, all built from the configuration."""

    def __init__(self, seed: int, entities: int, distractor_docs: int, doc_words: int,
                 title_weight: int, test_fraction: float) -> None:
        rng = random.Random(f"search_qa/world/{seed}")
        self.entities: list[Entity] = []
        self._make_entities(rng, entities)
        self.by_name = {normalize(e.name): i for i, e in enumerate(self.entities)}
        self.held_out = [hash01(e.name) < test_fraction for e in self.entities]
        self.held_in = [i for i, out in enumerate(self.held_out) if not out]
        by_kind = defaultdict(list)
        for i, e in enumerate(self.entities):
            by_kind[e.kind].append(i)
        for i, e in enumerate(self.entities):
            for label, kind, _ in RELATIONS[e.kind]:
                e.relations[label] = rng.choice([j for j in by_kind[kind] if j != i])
            for label, values, _ in ATTRIBUTES[e.kind]:
                e.attributes[label] = str(rng.choice(values) if isinstance(values, list)
                                          else rng.randint(*values))
        self.neighbours = defaultdict(list)  # entities sharing a name token
        for i, e in enumerate(self.entities):
            for tok in set(tokens(e.name)):
                self.neighbours[tok].append(i)
        texts = [(e.name, self._entity_text(rng, i, doc_words))
                 for i, e in enumerate(self.entities)]
        texts += [self._chronicle(rng, n, doc_words) for n in range(distractor_docs)]
        order = list(range(len(texts)))
        rng.shuffle(order)  # ids say nothing about the kind of document
        self.docs: dict[str, tuple[str, str]] = {}
        for pos, k in enumerate(order):
            doc_id = f"d{pos:05d}"
            self.docs[doc_id] = texts[k]
            if k < len(self.entities):
                self.entities[k].doc_id = doc_id
        self.doc_ids = list(self.docs)
        self.by_title = {normalize(t): d for d, (t, _) in self.docs.items()}
        self._index(title_weight)

    def _make_entities(self, rng: random.Random, n: int) -> None:
        def word(syllables: int) -> str:
            return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                           for _ in range(syllables)).capitalize()

        people, places = n // 2, n // 4
        given = [word(2) for _ in range(max(5, people // 3))]
        family = [word(rng.choice((2, 3))) for _ in range(max(5, people // 4))]
        taken: set[str] = set()
        while len(self.entities) < n:
            if len(self.entities) < people:
                name, kind = f"{rng.choice(given)} {rng.choice(family)}", "person"
            elif len(self.entities) < people + places:
                name, kind = word(3), "place"
            else:
                places_made = [e.name for e in self.entities if e.kind == "place"]
                stem = rng.choice(places_made) if rng.random() < 0.4 else word(2)
                name, kind = f"{stem} {rng.choice(ORG_KINDS)}", "organisation"
            if normalize(name) in taken:
                given.append(word(2))  # the pools grow rather than loop forever
            else:
                taken.add(normalize(name))
                self.entities.append(Entity(name, kind))

    def _filler(self, rng: random.Random, subject: str) -> str:
        template = rng.choice(FILLER)
        other = rng.choice(self.entities).name
        if "confused" in template:  # a namesake where there is one
            near = self.neighbours[rng.choice(tokens(subject))]
            other = self.entities[rng.choice(near)].name if near else other
        other = other if other != subject else rng.choice(self.entities).name
        return template.format(s=subject, o=other, y=rng.randint(1100, 1999), n=rng.randint(2, 90))

    def _entity_text(self, rng: random.Random, i: int, doc_words: int) -> str:
        e = self.entities[i]
        facts = [s.format(s=e.name, o=self.entities[e.relations[lab]].name)
                 for lab, _, s in RELATIONS[e.kind]]
        facts += [s.format(s=e.name, v=e.attributes[lab]) for lab, _, s in ATTRIBUTES[e.kind]]
        body = facts + [self._filler(rng, e.name)
                        for _ in range(max(0, doc_words - 8 * len(facts)) // 8)]
        rng.shuffle(body)
        article = "an" if e.kind[0] in "aeiou" else "a"
        return " ".join([f"{e.name} is {article} {e.kind} on record."] + body)

    def _chronicle(self, rng: random.Random, n: int, doc_words: int) -> tuple[str, str]:
        cast = [e.name for e in rng.sample(self.entities, 3)]
        title = f"Chronicle {n + 1}: {cast[0]}, {cast[1]} and {cast[2]}"
        body = [self._filler(rng, rng.choice(cast)) for _ in range(doc_words // 8)]
        return title, " ".join([f"This chronicle concerns {', '.join(cast)}."] + body)

    def _index(self, title_weight: int) -> None:
        self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.lengths: list[int] = []
        for d, (title, text) in enumerate(self.docs.values()):
            toks = tokens(title) * title_weight + tokens(text)
            counts: dict[str, int] = defaultdict(int)
            for t in toks:
                counts[t] += 1
            for t, c in counts.items():
                self.postings[t].append((d, c))
            self.lengths.append(len(toks))
        self.mean_length = sum(self.lengths) / max(1, len(self.lengths))

    def search(self, query: str, k: int) -> list[str]:
        """Doc ids of the ``k`` best BM25 matches (an exact title match first)."""
        scores: dict[int, float] = defaultdict(float)
        n = len(self.lengths)
        for t in set(tokens(query)):
            post = self.postings.get(t, ())
            idf = math.log(1 + (n - len(post) + 0.5) / (len(post) + 0.5))
            for d, tf in post:
                norm = _K1 * (1 - _B + _B * self.lengths[d] / self.mean_length)
                scores[d] += idf * tf * (_K1 + 1) / (tf + norm)
        ranked = [self.doc_ids[d] for d in sorted(scores, key=lambda d: (-scores[d], d))]
        exact = self.by_title.get(normalize(query))
        if exact is not None:
            ranked = [exact] + [d for d in ranked if d != exact]
        return ranked[:k]

    def walk(self, rng: random.Random, hops: int, test: bool) -> Chain | None:
        """A random chain of ``hops`` evidence documents (None when the walk gets stuck)."""
        inside = (lambda j: True) if test else (lambda j: not self.held_out[j])
        docs = [rng.choice(self.held_in) if not test else rng.randrange(len(self.entities))]
        labels: list[str] = []
        for step in range(hops):
            e = self.entities[docs[-1]]
            options = [(lab, j) for lab, j in e.relations.items() if j not in docs and inside(j)]
            if step == hops - 1:
                if test and not self.held_out[docs[-1]]:
                    return None
                options += [(lab, -1) for lab in e.attributes]
            if not options:
                return None
            label, j = rng.choice(sorted(options))
            labels.append(label)
            if step < hops - 1:
                docs.append(j)
        return self.chain(docs[0], labels)

    def chain(self, anchor: int, labels: list[str]) -> Chain:
        """Resolve ``labels`` (innermost first) from ``anchor``; ValueError if one fails."""
        docs, cur = [anchor], anchor
        for k, label in enumerate(labels):
            e = self.entities[cur]
            if label in e.attributes and k == len(labels) - 1:
                value = e.attributes[label]
            elif label in e.relations:
                cur = e.relations[label]
                value = self.entities[cur].name
                if k < len(labels) - 1:
                    docs.append(cur)
            else:
                last = " (only the last label may be an attribute)" if label in e.attributes else ""
                raise ValueError(f"{label[:40]!r} is not a relation of a {e.kind}{last}")
        phrase = " of the ".join(reversed(labels))
        who = "Who" if labels[-1] in e.relations and self.entities[cur].kind == "person" else "What"
        question = f"{who} is the {phrase} of {self.entities[anchor].name}?"
        return Chain(question, tuple(docs), tuple(labels), value)


_WORLDS: dict[tuple, World] = {}


def load_world(*config: Any) -> World:
    """The world of a configuration, built once per process."""
    if config not in _WORLDS:
        _WORLDS[config] = World(*config)
    return _WORLDS[config]
