"""General chat prompts: the anchor's other abilities, kept apart from the made-up world.

EVALUATION: 16 questions with written answers; the table reports the perplexity of those answers, and how many greedy
answers hold an expected word (EXPECTED: 'Paris', 'seven' or '7'...), with the bridge on and off. Never trained on.
REHEARSAL: other general questions (generated from templates, none of them in EVALUATION); the bridge is trained on
them with the anchor's own greedy answers as targets, so that it learns to write nothing where m_A has nothing to
add (without them, every example asks for a town, and the bridge writes a town everywhere).
"""
from __future__ import annotations

import random

from calm_core.training.forgetting import EXPECTED_WORDS, GENERAL_QUESTIONS, holds_expected

# the evaluation questions, their expected words and the check live in calm_core (the lab's forgetting set): the
# same objects, so this demo's tables and the app's comparison ask the same thing
EVALUATION, EXPECTED, holds_expected = GENERAL_QUESTIONS, EXPECTED_WORDS, holds_expected


_TEMPLATES = {
    "What is the capital of {}?": ["Italy", "Spain", "Germany", "Japan", "Egypt", "Canada", "Brazil", "Kenya",
                                    "Norway", "Peru", "India", "Greece", "Mexico", "Sweden", "Poland", "Chile"],
    "What is {} plus {}?": [("four", "five"), ("six", "one"), ("ten", "seven"), ("three", "three"), ("eight", "two")],
    "What is {} times {}?": [("two", "four"), ("three", "five"), ("six", "six"), ("seven", "two")],
    "What colour is {}?": ["fresh grass", "snow", "a ripe tomato", "coal", "an orange", "a lemon", "milk"],
    "What is the opposite of {}?": ["big", "fast", "up", "light", "early", "happy", "open", "full", "old", "wet"],
    "Give me a word that rhymes with {}.": ["dog", "tree", "moon", "cake", "ring", "boat", "rain", "star"],
    "Translate '{}' into English.": ["merci", "gracias", "danke", "ciao", "hola", "adios", "bonsoir"],
    "How many {} are there in {}?": [("hours", "a day"), ("minutes", "an hour"), ("months", "a year"),
                                     ("seconds", "a minute"), ("days", "a year")],
    "Write one sentence about {}.": ["the sea", "autumn", "a cat", "music", "the moon", "bread", "trains"],
    "Name an animal that lives in {}.": ["the sea", "the desert", "a forest", "the Arctic", "a river"],
    "What do {} eat?": ["cows", "rabbits", "lions", "pandas", "owls", "horses"],
    "How many legs does {} have?": ["a dog", "a bird", "an ant", "a fish", "a horse"],
    "What is {} used for?": ["a hammer", "a spoon", "an umbrella", "a pencil", "a key", "a ladder"],
    "Explain in one sentence what {} is.": ["a volcano", "rain", "a library", "a bridge", "electricity"],
}


def rehearsal(count: int, seed: int = 0) -> list[str]:
    """Up to `count` general questions from the templates, shuffled (seeded); none is an EVALUATION question."""
    questions = []
    for template, fills in _TEMPLATES.items():
        for fill in fills:
            questions.append(template.format(*(fill if isinstance(fill, tuple) else (fill,))))
    held = {q for q, _ in EVALUATION}
    questions = [q for q in questions if q not in held]
    random.Random(f"rehearsal-{seed}").shuffle(questions)
    return questions[:count]

