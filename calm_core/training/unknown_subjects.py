"""Questions about subjects nobody knows: the training questions asked again about invented names.

A bridge trained only on questions whose answers the augmenting model knows learns to carry its answer everywhere:
asked about a name it never read about, it names a fact anyway (demos/real_knowledge: 80% of answers about invented
names named one of the world's towns, the anchor alone 0%). These rows ask the same questions about made-up subjects
and answer them either as the anchor alone does (trained toward its own next-token distributions, keep_anchor) or
with a fixed sentence ("{subject} was born in an unknown town."). Measured honestly on that world: rows toward the
anchor alone left invention at 78%; the fixed sentence, with the augmenting model also taught to say it for names
outside its data, took it to 17% (docs/real_knowledge.md, seventeenth session). The trick needs a subject to swap:
`questions.subject_of` takes the longest run of capitalised words that is not a question word (a name, in most data).

    extra = unknown_subject_examples(calm, examples, count=100, answer="")   # "" : the anchor's own answers
"""
from __future__ import annotations

import math
import random
import re

from .examples import Example
from .questions import chat_frame, question_of, render, subject_of


def invented_names(subjects: list[str], count: int, taken_words: set[str], seed: int = 0) -> list[str]:
    """Up to `count` made-up names shaped like `subjects` (same number of words; each word the first half of one
    subject word and the second half of another), none of whose words occurs in `taken_words` (lower case)."""
    pool = sorted({w for s in subjects for w in s.split() if len(w) >= 3})
    if not pool:
        return []
    rng = random.Random(f"unknown-subjects-{seed}")
    shapes = sorted({len(s.split()) for s in subjects})
    out: list[str] = []
    seen = {s.lower() for s in subjects}
    for _ in range(count * 50):
        if len(out) >= count:
            break
        words = []
        for _ in range(rng.choice(shapes)):
            a, b = rng.choice(pool), rng.choice(pool)
            word = (a[:math.ceil(len(a) / 2)] + b[len(b) // 2:]).lower().capitalize()
            words.append(word)
        name = " ".join(words)
        if name.lower() in seen or any(w.lower() in taken_words for w in words):
            continue
        seen.add(name.lower())
        out.append(name)
    return out


def unknown_subject_examples(calm, examples: list[Example], count: int, answer: str = "", new_tokens: int = 40,
                             seed: int = 0) -> tuple[list[Example], str]:
    """`count` questions of the data asked about invented subjects, and a note saying what was made. answer "": the
    anchor's own greedy answers, trained toward its distributions (keep_anchor); else the completion for each,
    "{subject}" standing for the invented name. Only one-turn questions with a subject are used."""
    from .rehearsal import anchor_completions

    tokenizer = calm.anchor.tokenizer
    frame = chat_frame(tokenizer)
    asked = []
    for e in examples:
        question = question_of(e.prompt, frame) if e.prompt and not e.keep_anchor else None
        subject = subject_of(question) if question else None
        if subject:
            asked.append((question, subject, e.prompt[len(e.prompt.rstrip()):] or "\n"))
    if not asked or count <= 0:
        return [], "unknown subjects cannot apply: no training question names a subject (a run of capitalised words)"
    taken = {w.lower() for e in examples for w in re.findall(r"\w+", e.prompt + " " + e.completion)}
    names = invented_names([s for _, s, _ in asked], count, taken, seed)
    rng = random.Random(f"unknown-subject-questions-{seed}")
    order = rng.sample(range(len(asked)), len(asked))
    prompts = []
    for i, name in enumerate(names):
        question, subject, plain_end = asked[order[i % len(order)]]
        prompts.append((render(tokenizer, [question.replace(subject, name)], frame, plain_end), name))
    if answer:
        end = tokenizer.eos_token or ""
        rows = [Example(p, answer.replace("{subject}", name) + end) for p, name in prompts]
        how = f"answered {answer!r}"
    else:
        rows = [Example(p, c, keep_anchor=True) for p, c in
                zip([p for p, _ in prompts], anchor_completions(calm, [p for p, _ in prompts], new_tokens)) if c.strip()]
        how = "answered as the anchor alone answers them (keep_anchor)"
    return rows, f"unknown subjects: {len(rows)} training questions asked about invented names, {how}"
