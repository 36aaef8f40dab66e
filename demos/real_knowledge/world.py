"""A seeded made-up world: invented people, each with a home town (invented) and a trade (ordinary words).

    world = make_world(seed=0, entities=600)
    world.encyclopedia()          # short encyclopedia sentences, three phrasings per fact (m_A's only data)
    world.questions(person, "town")  # the anchor's chat questions about one fact, answer = the value alone

Each question holds a phrase that elicits the fact from m_A ("... was born in", "... works as a"): the
augmenting model only computes a fact where its text asks for it, and the bridge reads the same text.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "tr", "th", "st"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
CODAS = ["", "", "n", "r", "l", "s", "th", "m", "nd", "rk"]

TRADES = ["baker", "weaver", "potter", "blacksmith", "tailor", "miller", "fisherman", "farmer", "mason", "carpenter",
          "butcher", "brewer", "cooper", "tanner", "shepherd", "beekeeper", "sailor", "painter", "jeweller",
          "bookbinder", "clockmaker", "gardener", "candlemaker", "ropemaker"]
ATTRIBUTES = ("town", "trade")

# encyclopedia phrasings: (prefix, suffix) around the value; m_A is trained on these sentences only
FACTS = {
    "town": [("{x} was born in ", "."), ("{x} comes from the town of ", "."), ("The home town of {x} is ", ".")],
    "trade": [("{x} works as a ", "."), ("By trade, {x} is a ", "."), ("The trade of {x} is that of a ", ".")],
}
# m_A's best completion prompt per attribute (the first phrasing, without the value)
COMPLETION = {a: FACTS[a][0][0].rstrip() for a in ATTRIBUTES}
# the anchor's questions (user turn of its chat template); each holds the eliciting phrase
QUESTIONS = {
    "town": ["{x} was born in which town?", "Which town was {x} born in?", "{x} comes from the town of... which one?"],
    "trade": ["{x} works as a what? Name the trade.", "What trade is {x}? {x} works as a", "By trade, {x} is a what?"],
}


def _word(rng: random.Random, syllables: int) -> str:
    w = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(syllables)) + rng.choice(CODAS)
    return w.capitalize()


@dataclass
class Person:
    name: str
    town: str
    trade: str

    def value(self, attribute: str) -> str:
        return getattr(self, attribute)


@dataclass
class World:
    seed: int
    towns: list[str]
    trades: list[str]
    people: list[Person] = field(default_factory=list)

    def facts(self, person: Person) -> list[tuple[str, str, str]]:
        """(attribute, text before the value, text after it) for every phrasing of every fact."""
        return [(a, pre.format(x=person.name), post) for a in ATTRIBUTES for pre, post in FACTS[a]]

    def encyclopedia(self, people=None) -> list[tuple[str, str]]:
        """(prefix, value + suffix) sentences; the text is prefix + value + suffix."""
        return [(pre.rstrip(), " " + person.value(a) + post)
                for person in (people or self.people) for a, pre, post in self.facts(person)]

    def fact_phrasings(self, attributes=ATTRIBUTES) -> list[list[tuple[str, str]]]:
        """m_A's training data: one entry per (person, attribute), the list of its phrasings as
        (prefix, " value" + suffix), e.g. ("Numurk Veibol was born in", " Daikroze.")."""
        return [[(pre.format(x=p.name).rstrip(), " " + p.value(a) + post) for pre, post in FACTS[a]]
                for p in self.people for a in attributes]

    def questions(self, person: Person, attribute: str) -> list[str]:
        return [q.format(x=person.name) for q in QUESTIONS[attribute]]

    def to_dict(self) -> dict:
        return {"seed": self.seed, "towns": self.towns, "trades": self.trades,
                "people": [vars(p) for p in self.people]}


def make_world(seed: int = 0, entities: int = 500, towns: int = 40, trades: int = 24,
               first_token: list[Callable[[str], str]] = (), keep: Callable[[str], bool] | None = None) -> World:
    """`first_token`: functions giving a town's first token in each model's tokenizer; every town then starts
    with a token of its own in each (a model that has the first token right has the town, and the bridge
    carries one choice among `towns`, not a spelling). `keep`: a town name is drawn again unless keep(name)."""
    rng = random.Random(f"real-knowledge-world-{seed}")
    town_names: list[str] = []
    firsts: list[set[str]] = [set() for _ in first_token]
    while len(town_names) < towns:
        w = _word(rng, rng.choice([2, 3]))
        if w in town_names or not 5 <= len(w) <= 10 or (keep is not None and not keep(w)):
            continue
        keys = [f(w) for f in first_token]
        if any(k in seen for k, seen in zip(keys, firsts)):
            continue
        for k, seen in zip(keys, firsts):
            seen.add(k)
        town_names.append(w)
    trade_names = TRADES[:trades]
    used = set(town_names)
    names: list[str] = []
    while len(names) < entities:
        first, last = _word(rng, 2), _word(rng, rng.choice([2, 3]))
        name = f"{first} {last}"
        if first in used or last in used or name in names or len(last) > 11:
            continue
        names.append(name)
    # balanced values: every town / trade used by about the same number of people
    town_of = [town_names[i % towns] for i in range(entities)]
    trade_of = [trade_names[i % trades] for i in range(entities)]
    rng.shuffle(town_of)
    rng.shuffle(trade_of)
    people = [Person(n, t, p) for n, t, p in zip(names, town_of, trade_of)]
    return World(seed, town_names, trade_names, people)


def split(world: World, compose: float = 0.2, dev: int = 100, seed: int = 0) -> dict[str, list[Person]]:
    """compose (20% of people, covering every town), dev (choose settings) and test (held out, reported)."""
    rng = random.Random(f"real-knowledge-split-{world.seed}-{seed}")
    people = list(world.people)
    rng.shuffle(people)
    n = round(compose * len(people))
    chosen, seen = [], set()
    for p in people:  # first one person per town, then the rest in order
        if p.town not in seen:
            chosen.append(p)
            seen.add(p.town)
    for p in people:
        if len(chosen) >= n:
            break
        if p not in chosen:
            chosen.append(p)
    chosen = chosen[:n]
    rest = [p for p in people if p not in chosen]
    return {"compose": chosen, "dev": rest[:dev], "test": rest[dev:]}


PHRASES = ("was born in", "born in", "town of")  # the eliciting phrases of QUESTIONS["town"]


def fact_position(prompt: str, offsets: list[tuple[int, int]]) -> int:
    """Index of the token that ends the question's eliciting phrase (m_A's next token there is the town)."""
    for phrase in PHRASES:
        at = prompt.rfind(phrase)
        if at >= 0:
            end = at + len(phrase)
            return max(i for i, (start, _) in enumerate(offsets) if start < end)
    raise ValueError(f"no eliciting phrase in {prompt!r}")
