"""A training row's question: read back from a prompt in the anchor's chat template, written again in it, and its
subject (the name it asks about). Shared by the data tricks (question_variants.py, unknown_subjects.py)."""
from __future__ import annotations

import re

FUNCTION_WORDS = set(
    "Where What Which Who Whom Whose When Why How Is Are Was Were Do Does Did Can Could Would Will Should Tell Please "
    "Hello Hi Hey Quick The In From On At Of For Give Name I I'd I'm I've Thanks Thank Good Sure Keep Reply A An My "
    "Your It This That These Those Yes No Okay OK Explain Write Translate Describe List Say Answer Question Dear So "
    "And But Or If Also Then Now Here There Today Morning".split())
_RUN = re.compile(r"[A-Z][\w'’-]*(?:[ \t]+[A-Z][\w'’-]*)*")


def subject_of(question: str) -> str | None:
    """The question's subject: the longest run of capitalised words after its leading question or function words
    ("Albert Einstein" in "Where was Albert Einstein born?"); None when there is none."""
    best = None
    for match in _RUN.finditer(question):
        words = match.group().split()
        while words and words[0] in FUNCTION_WORDS:
            words = words[1:]
        while words and words[-1] in FUNCTION_WORDS:
            words = words[:-1]
        if words and (best is None or (len(words), len(" ".join(words))) > (len(best), len(" ".join(best)))):
            best = words
    return " ".join(best) if best else None


def chat_frame(tokenizer) -> tuple[str, str] | None:
    """(text before, text after) a single user message in the anchor's chat template, or None without one."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "\x00QUESTION\x00"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                             add_generation_prompt=True)
    head, _, tail = rendered.partition(marker)
    return (head, tail) if head else None


def question_of(prompt: str, frame: tuple[str, str] | None) -> str | None:
    """The user question inside a one-turn chat prompt (None for any other prompt), or a plain prompt's text."""
    if frame is None:
        return prompt.rstrip() or None
    head, tail = frame
    if not (prompt.startswith(head) and prompt.endswith(tail)) or len(prompt) < len(head) + len(tail):
        return None
    question = prompt[len(head):len(prompt) - len(tail)]
    # a longer chat holds the end of a turn inside ("<|im_end|>" in ChatML): not a one-turn question
    turn_end = tail.strip().splitlines()[0] if tail.strip() else ""
    if not question.strip() or head.strip() in question or (turn_end and turn_end in question):
        return None
    return question


def render(tokenizer, turns: list[str], frame: tuple[str, str] | None, plain_end: str = "\n") -> str:
    """Turns written as the training prompts are: in the chat template, or the last turn as plain text."""
    if frame is None:
        return turns[-1] + plain_end
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
