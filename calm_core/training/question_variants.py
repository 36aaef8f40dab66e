"""Question variants: each training question also asked with an opener or a closer, in lower case, with a typo, or
as the second turn of a chat; the answer stays the same.

A bridge trained on a few fixed wordings learns to read the augmenting model at one place of one sentence, and a
user who types their own words gets a guess (demos/real_knowledge: 65.6% on four plain forms it never trained on,
against 93.8% in the trained ones). Surface variants of the same questions teach it to find the fact wherever the
question puts it; on the real-model world they took the never-trained forms to 89.8% (docs/real_knowledge.md).

The subject of a question (questions.subject_of: a name) is kept as it was: lower case and typos touch the
other words. Prompts in the anchor's chat template are read back to their user question and written again in it;
plain prompts are varied as they are.

    extra = variant_examples(tokenizer, examples, per_example=2, seed=0)
"""
from __future__ import annotations

import random
import re
from typing import Callable

from .examples import Example
from .questions import chat_frame, question_of, render, subject_of

OPENERS = ["", "", "", "Hello! ", "Quick question: ", "I have a question. ", "Hey there, ", "Please help me. "]
CLOSERS = ["", "", "", " Please answer briefly.", " Thank you!", " Keep it short.", " Thanks in advance."]
FIRST_TURNS = [("Hello, can I ask you something?", "Sure, go ahead!"),
               ("Good morning!", "Good morning! How can I help you today?"),
               ("I need some help with names and places.", "Happy to help. What would you like to know?")]
PLACEHOLDER = "{x}"  # where the subject stands while a question is varied


def normal(text: str) -> str:
    """Lower case, punctuation and runs of space removed: two questions that differ only so are the same form."""
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s{}]", "", text.lower())).strip()


def typo(text: str, rng: random.Random) -> str:
    """Two neighbouring letters swapped in one word of four or more letters that is not the placeholder."""
    words = [(m.start(), m.end()) for m in re.finditer(r"[A-Za-z]{4,}", text) if "{" not in text[m.start() - 1:m.end() + 1]]
    if not words:
        return text
    start, end = rng.choice(words)
    i = rng.randrange(start, end - 1)
    return text[:i] + text[i + 1] + text[i] + text[i + 2:]


def vary(rng: random.Random, question: str | Callable[[random.Random], str], forbidden: frozenset | set = frozenset(),
         closers: list[str] = CLOSERS, first_turns: bool = True) -> list[str]:
    """One variant as chat turns (user, assistant, ..., user). `question`: the question, "{x}" for its subject, or a
    function drawing one from `rng` (a grammar's core). 15% lower case, 10% a typo, 15% after a first exchange; a
    variant whose normal() form is in `forbidden` (held-out test forms) is drawn again."""
    for _ in range(1000):
        opener = rng.choice(OPENERS)
        text = opener + (question(rng) if callable(question) else question) + rng.choice(closers)
        roll = rng.random()
        if roll < 0.15:
            text = text.lower()  # the placeholder is lower case already
        elif roll < 0.25:
            text = typo(text, rng)
        if normal(text) in forbidden:
            continue
        turns = [text]
        if first_turns and rng.random() < 0.15:
            turns = list(rng.choice(FIRST_TURNS)) + turns
        return turns
    raise ValueError("every variant drawn is a forbidden form")


def variant_examples(tokenizer, examples: list[Example], per_example: int, seed: int = 0) -> list[Example]:
    """`per_example` variants of every question row (not keep_anchor), each with the row's own completion; a row whose
    prompt is not a one-turn question (a plain-text row, a longer chat) gets none. Same seed, same variants."""
    rng = random.Random(f"question-variants-{seed}")
    frame = chat_frame(tokenizer)
    out = []
    for e in examples:
        question = question_of(e.prompt, frame) if e.prompt and not e.keep_anchor else None
        if question is None:
            continue
        plain_end = e.prompt[len(e.prompt.rstrip()):] or "\n"
        subject = subject_of(question)
        core = question.replace(subject, PLACEHOLDER) if subject else question
        seen = {normal(core)}  # no variant repeats the question or another variant
        for _ in range(per_example):
            turns = vary(rng, core, frozenset(seen), first_turns=frame is not None)
            seen.add(normal(turns[-1]))
            turns = [t.replace(PLACEHOLDER, subject) if subject else t for t in turns]
            out.append(Example(render(tokenizer, turns, frame, plain_end), e.completion))
    return out
