"""What the bridge is asked but never trained on: question forms, unknown people and famous people.

Nothing in training or in any setting's choice reads NEVER_TRAINED (tests/test_real_knowledge_probe.py checks that no
training phrasing equals one of these forms). `generalisation.py` scores a bridge on them.

NEVER_TRAINED: the home-town question in other words: other syntax, lower case, a typo in the question word, the
question inside a longer message, the name late in the sentence, a second turn of a chat, "do you know...", a
request for one word. Each form is a list of chat turns; "{x}" is the person's name.
DEV_FORMS: other never-trained forms, the ones settings are chosen on (with the development people).
unknown_names: invented names that are no person of the world (m_A never read about them), drawn from another seed.
FAMOUS: real people with the town the anchor might know (the expected word); the bridge must leave them to it.
"""
from __future__ import annotations

import random

from . import world as W

# a first turn for the "second turn of a chat" form, with the anchor-style reply it is continued from
_GREETING = ("Hi! I have a couple of questions about people, is that ok?",
             "Of course! Ask me anything and I'll do my best to help.")

NEVER_TRAINED: dict[str, list[str]] = {
    "where": ["Where was {x} born?"],
    "in which town (other syntax)": ["In which town was {x} born?"],
    "lower case": ["which town is {x} from"],
    "typo in the question word": ["Whcih town was {x} born in?"],
    "inside a longer message": ["I'm putting together a family tree and I got stuck on one person. What was the home "
                                "town of {x}? Thanks a lot!"],
    "name late": ["Could you tell me the name of the town that is the birthplace of {x}?"],
    "second turn": [_GREETING[0], _GREETING[1], "Great. What is the home town of {x}?"],
    "do you know": ["Do you know where {x} was born?"],
    "one word": ["Answer with one word only: the town where {x} was born."],
    "possessive": ["{x}'s home town is called what?"],
    "birthplace": ["What is the birthplace of {x}?"],
}

# forms for choosing settings (with the development people): never trained either, and never the reported ones, so
# that the reported never-trained forms stay out of every selection step
DEV_FORMS: dict[str, list[str]] = {
    "where from": ["Where is {x} from?"],
    "town of birth": ["what is the town of birth of {x}?"],
    "context first": ["I met {x} at the market yesterday. Which town do they come from?"],
    "clipped": ["Hometown of {x}?"],
    "dash": ["{x} - where was this person born?"],
    "can you say": ["Can you say which town {x} was born in?"],
    "second turn (dev)": ["Hi there.", "Hello! How can I help you today?", "Which town is {x} originally from?"],
    "one word (dev)": ["In one word: {x}'s birthplace?"],
}

FAMOUS = [  # (name, expected words in a right answer)
    ("Albert Einstein", ("Ulm", "Germany")), ("Wolfgang Amadeus Mozart", ("Salzburg", "Austria")),
    ("William Shakespeare", ("Stratford",)), ("Napoleon Bonaparte", ("Ajaccio", "Corsica")),
    ("Pablo Picasso", ("Málaga", "Malaga", "Spain")), ("Ludwig van Beethoven", ("Bonn", "Germany")),
    ("Leonardo da Vinci", ("Vinci", "Italy", "Florence")), ("Barack Obama", ("Honolulu", "Hawaii")),
    ("Isaac Newton", ("Woolsthorpe", "England", "Lincolnshire")), ("Charles Darwin", ("Shrewsbury", "England")),
    ("Mahatma Gandhi", ("Porbandar", "India")), ("Elvis Presley", ("Tupelo", "Mississippi")),
    ("Vincent van Gogh", ("Zundert", "Netherlands")), ("Galileo Galilei", ("Pisa", "Italy")),
    ("Marie Curie", ("Warsaw", "Poland")), ("Frédéric Chopin", ("Żelazowa", "Zelazowa", "Poland", "Warsaw")),
    ("Abraham Lincoln", ("Kentucky", "Hodgenville")), ("Johann Sebastian Bach", ("Eisenach", "Germany")),
    ("Nelson Mandela", ("Mvezo", "South Africa")), ("Walt Disney", ("Chicago",)),
]


def unknown_names(world: W.World, count: int, seed: int = 0) -> list[str]:
    """`count` invented names (the world's own syllables) that are no person and no town of `world`."""
    rng = random.Random(f"real-knowledge-unknown-{world.seed}-{seed}")
    taken = {p.name for p in world.people} | set(world.towns)
    taken_words = {w for p in world.people for w in p.name.split()} | set(world.towns)
    out: list[str] = []
    while len(out) < count:
        first, last = W._word(rng, 2), W._word(rng, rng.choice([2, 3]))
        name = f"{first} {last}"
        if name in taken or first in taken_words or last in taken_words or name in out or len(last) > 11:
            continue
        out.append(name)
    return out


def chat_prompt(tok, turns: list[str], name: str) -> str:
    """The anchor's chat template over alternating user/assistant turns (the last one the user's)."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t.format(x=name)} for i, t in enumerate(turns)]
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def question_text(turns: list[str], name: str) -> str:
    """The form's last user turn (what a table shows)."""
    return turns[-1].format(x=name)
