"""General chat prompts: the anchor's other abilities, kept apart from the made-up world.

EVALUATION: 16 questions with written answers; the table reports the perplexity of those answers, and how many greedy
answers hold an expected word (EXPECTED: 'Paris', 'seven' or '7'...), with the bridge on and off. Never trained on.
REHEARSAL: other general questions (generated from templates, none of them in EVALUATION); the bridge is trained on
them with the anchor's own greedy answers as targets, so that it learns to write nothing where m_A has nothing to
add (without them, every example asks for a town, and the bridge writes a town everywhere).
"""
from __future__ import annotations

import random
import re

EVALUATION = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("How many days are there in a week?", "There are seven days in a week."),
    ("What colour is the sky on a clear day?", "On a clear day the sky is blue."),
    ("Name a fruit that is yellow.", "A banana is a yellow fruit."),
    ("What do bees make?", "Bees make honey."),
    ("What is two plus three?", "Two plus three is five."),
    ("Which animal is known for saying 'moo'?", "A cow says moo."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("Give me a word that rhymes with cat.", "Hat rhymes with cat."),
    ("What do plants need to grow?", "Plants need water, light and soil to grow."),
    ("Translate 'bonjour' into English.", "Bonjour means hello."),
    ("What is the largest ocean on Earth?", "The Pacific Ocean is the largest ocean on Earth."),
    ("Write a short greeting for a friend.", "Hello, my friend! I hope you are having a wonderful day."),
    ("What is water made of?", "Water is made of hydrogen and oxygen."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What season comes after winter?", "Spring comes after winter."),
]

# words that a right answer holds (any one, whole word, any case); lenient on purpose: the check asks whether the
# bridge broke an answer the anchor had right ('Paris' -> 'Benef-sur-Maine'), not how well the anchor writes
EXPECTED = {
    "What is the capital of France?": ("Paris",),
    "How many days are there in a week?": ("seven", "7"),
    "What colour is the sky on a clear day?": ("blue",),
    "Name a fruit that is yellow.": ("banana", "bananas", "lemon", "lemons", "pineapple", "mango", "Golden Delicious",
                                     "yellow apple", "grapefruit", "quince"),
    "What do bees make?": ("honey", "wax", "beeswax"),
    "What is two plus three?": ("five", "5"),
    "Which animal is known for saying 'moo'?": ("cow", "cows", "cattle"),
    "What is the opposite of hot?": ("cold",),
    "Give me a word that rhymes with cat.": ("hat", "bat", "mat", "rat", "sat", "fat", "pat", "chat", "flat", "that",
                                             "splat", "brat", "spat", "vat", "gnat"),
    "What do plants need to grow?": ("water", "light", "sunlight", "soil", "nutrients", "sun", "carbon dioxide"),
    "Translate 'bonjour' into English.": ("hello", "good day", "good morning", "hi"),
    "What is the largest ocean on Earth?": ("Pacific",),
    "Write a short greeting for a friend.": ("hello", "hi", "hey", "dear", "greetings", "good morning"),
    "What is water made of?": ("hydrogen", "oxygen", "H2O"),
    "How many legs does a spider have?": ("eight", "8"),
    "What season comes after winter?": ("spring",),
}


def holds_expected(question: str, answer: str) -> bool:
    """Whether the answer holds one of the question's EXPECTED words (whole word, any case)."""
    return any(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", answer, re.IGNORECASE)
               for w in EXPECTED[question])


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

