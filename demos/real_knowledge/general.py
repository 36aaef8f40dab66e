"""General chat prompts: the anchor's other abilities, kept apart from the made-up world.

EVALUATION: 16 questions with written answers; the table reports the perplexity of those answers, and how many greedy
answers hold an expected word (EXPECTED: 'Paris', 'seven' or '7'...), with the bridge on and off. Never trained on.
REHEARSAL: other general questions (generated from templates, none of them in EVALUATION); the bridge is trained on
them with the anchor's own greedy answers as targets, so that it learns to write nothing where m_A has nothing to
add (without them, every example asks for a town, and the bridge writes a town everywhere).
"""
from __future__ import annotations

from calm_core.training.forgetting import EXPECTED_WORDS, GENERAL_QUESTIONS, holds_expected
from calm_core.training.rehearsal import rehearsal_questions

# the evaluation questions, their expected words and the check live in calm_core (the lab's forgetting set): the
# same objects, so this demo's tables and the app's comparison ask the same thing
EVALUATION, EXPECTED, holds_expected = GENERAL_QUESTIONS, EXPECTED_WORDS, holds_expected


def rehearsal(count: int, seed: int = 0) -> list[str]:
    """Up to `count` general questions from the templates, shuffled (seeded); none is an EVALUATION question
    (calm_core's rehearsal questions: the knowledge recipe builds its rehearsal rows from them)."""
    return rehearsal_questions(count, seed)
