"""Rehearsal rows: general questions answered by the anchor itself, trained toward its own next-token distributions
(Example.keep_anchor), so that a bridge learns to write nothing where the augmenting model has nothing to add.
Without them every training example asks for the new knowledge, and the bridge writes it everywhere.

The questions come from templates (none of them in the forgetting set, forgetting.py, which is for evaluation only)
and are written the way the training prompts are: in the anchor's chat template when the training prompts use it,
as plain text otherwise."""
from __future__ import annotations

import random

from .examples import Example
from .forgetting import GENERAL_QUESTIONS

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


def rehearsal_questions(count: int, seed: int = 0) -> list[str]:
    """Up to `count` general questions from the templates, shuffled (seeded); none is a forgetting-set question."""
    questions = [template.format(*(fill if isinstance(fill, tuple) else (fill,)))
                 for template, fills in _TEMPLATES.items() for fill in fills]
    held = {q for q, _ in GENERAL_QUESTIONS}
    questions = [q for q in questions if q not in held]
    random.Random(f"rehearsal-{seed}").shuffle(questions)
    return questions[:count]


def uses_chat_template(tokenizer, examples: list[Example]) -> bool:
    """Whether most training prompts are written in the anchor's chat template (its text before a user message)."""
    from .questions import chat_frame

    frame = chat_frame(tokenizer)
    if frame is None or not examples:
        return False
    return sum(e.prompt.startswith(frame[0]) for e in examples) * 2 > len(examples)


def rehearsal_examples(calm, examples: list[Example], count: int, new_tokens: int = 40, seed: int = 0) -> list[Example]:
    """`count` keep_anchor examples: general questions in the training prompts' format, completed by the anchor alone
    (greedy); an answer that ended within new_tokens keeps its end-of-sequence token."""
    tokenizer = calm.anchor.tokenizer
    chat = uses_chat_template(tokenizer, examples)
    questions = rehearsal_questions(count, seed)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True) if chat else q + "\n" for q in questions]
    return [Example(p, c, keep_anchor=True) for p, c in zip(prompts, anchor_completions(calm, prompts, new_tokens))
            if c.strip()]


def anchor_completions(calm, prompts: list[str], new_tokens: int) -> list[str]:
    """The anchor alone's greedy answers (batched); one that ended within new_tokens keeps its end-of-sequence token,
    so that training toward it also teaches where to stop."""
    from ..engine.compose import ComposedLM
    from .evaluation import predictions

    tokenizer = calm.anchor.tokenizer
    anchor = ComposedLM((calm.anchor.model, tokenizer), [])
    answers = predictions(anchor, [Example(p, "") for p in prompts], max_new_tokens=new_tokens)
    ended = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) < new_tokens for a in answers]
    return [a + ((tokenizer.eos_token or "") if e else "") for a, e in zip(answers, ended)]
