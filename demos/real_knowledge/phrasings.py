"""Varied training questions from a small template grammar, and questions about people nobody knows.

The bridge trained on three fixed question forms reads m_A at one place of one sentence; asked in other words it
falls back on guessing. Here each composition person is asked in forms drawn from a grammar (an opener, a core
question, a closer; sometimes in lower case, with a typo, or as the second turn of a chat), so the bridge learns to
read m_A wherever the town is. The dressing is calm_core's (training/question_variants.py, the recipe step
question_variants any pair's data can use); the core questions are this world's. None of the grammar's questions is a form of probe_forms.NEVER_TRAINED or DEV_FORMS: that module is
read here only to throw out a drawn question equal to one of them (lower case, punctuation ignored).

Unknown people (`unknown_questions`): invented names that are no person of the world, asked the same way; their rows
are trained toward the anchor's own next-token distributions (keep_anchor), so the bridge learns to stay closed when
m_A has nothing to say about a name, instead of naming a town.
"""
from __future__ import annotations

import random

from calm_core.training import question_variants as V

from . import world as W

CORES = [  # the home-town question; {x} is the name
    "{x} was born in which town?", "Which town was {x} born in?", "{x} comes from the town of... which one?",
    "What town was {x} born in?", "Tell me which town {x} comes from.", "{x} is from which town?",
    "Where does {x} come from?", "{x} was born where?", "I'd like to know the town {x} was born in.",
    "Which is the home town of {x}?", "From what town does {x} come?", "What's the name of the town {x} comes from?",
    "The home town of {x} is which town?", "Which town is the birthplace of {x}?",
]
CLOSERS = ["", "", "", " Reply with the town's name.", " Thank you!", " Keep it short.", " Thanks in advance."]


def _test_forms() -> set[str]:
    from .probe_forms import DEV_FORMS, NEVER_TRAINED  # only to exclude them

    return {V.normal(turn) for forms in (NEVER_TRAINED, DEV_FORMS) for turns in forms.values() for turn in turns
            if "{x}" in turn}


def draw(rng: random.Random, core: str | None = None) -> list[str]:
    """One question as chat turns (user, assistant, ..., user), "{x}" in place of the name: a core question (drawn
    from CORES) dressed by calm_core's question variants (an opener, a closer, lower case, a typo, a first turn)."""
    return V.vary(rng, lambda r: core or r.choice(CORES), frozenset(_test_forms()), closers=CLOSERS)


def questions(people: list[W.Person], per_person: int, seed: int) -> list[tuple[W.Person, list[str]]]:
    """(person, turns) pairs: each person asked in the three trained forms and in per_person - 3 drawn ones."""
    rng = random.Random(f"real-knowledge-phrasings-{seed}")
    out = []
    for p in people:
        out += [(p, [q]) for q in W.QUESTIONS["town"][:min(3, per_person)]]
        out += [(p, draw(rng)) for _ in range(max(0, per_person - 3))]
    return out


def unknown_questions(world: W.World, count: int, seed: int) -> list[tuple[str, list[str]]]:
    """(invented name, turns) for `count` names that are no person of the world (another stream than the
    evaluation's unknown names: probe_forms.unknown_names draws with seed 0 of its own prefix)."""
    from .probe_forms import unknown_names

    rng = random.Random(f"real-knowledge-unknown-rows-{seed}")
    held = set(unknown_names(world, 200))
    names = [n for n in unknown_names(world, count + 400, seed=1000 + seed) if n not in held][:count]
    return [(n, draw(rng)) for n in names]
