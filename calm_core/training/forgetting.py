"""What training costs the anchor on what it already knew: general questions with written answers (never trained
on), scored for any model that answers in the anchor's format. Two numbers per model: the perplexity of the written
answers against the anchor's own (a ratio; 1.0 is unchanged), and how many greedy answers hold an expected word
('Paris' for the capital of France; lenient on purpose: it asks whether an answer was broken, not how well it is
written). The set came from the real-pair knowledge demo, where it caught a bridge that renamed the capital of France.
"""
from __future__ import annotations

import re

from .evaluation import lm_loss, predictions
from .examples import Example

GENERAL_QUESTIONS = [
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
EXPECTED_WORDS = {
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
               for w in EXPECTED_WORDS[question])

FORGETTING_NEW_TOKENS = 24


def forgetting_examples(tokenizer) -> list[Example]:
    """The questions as the anchor is asked: in its chat template where it has one, else "Question: ...\nAnswer:"."""
    def prompt(question: str) -> str:
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                 add_generation_prompt=True)
        return f"Question: {question}\nAnswer:"
    lead = "" if getattr(tokenizer, "chat_template", None) else " "
    return [Example(prompt(q), lead + a) for q, a in GENERAL_QUESTIONS]


def forgetting_rows(contenders, tokenizer, max_new_tokens: int = FORGETTING_NEW_TOKENS) -> list[dict]:
    """One row per (name, model): perplexity of the written answers, its ratio to the first contender's (the anchor
    alone), and greedy answers holding an expected word, out of all."""
    examples, rows = forgetting_examples(tokenizer), []
    for name, model in contenders:
        perplexity = lm_loss(model, examples)["perplexity"]
        answers = predictions(model, examples, max_new_tokens)
        held = sum(holds_expected(q, a) for (q, _), a in zip(GENERAL_QUESTIONS, answers))
        rows.append({"model": name, "perplexity": perplexity, "expected_words": f"{held}/{len(answers)}"})
    for row in rows:
        row["perplexity_ratio"] = row["perplexity"] / rows[0]["perplexity"]
    return rows
