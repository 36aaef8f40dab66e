"""Real famous people taught to m_A as known, beside the names outside the world taught as unknown.

m_A taught "NAME was born in an unknown town." for 600 invented names learned more than that: asked about Albert
Einstein it says "an unknown town" too, and the composition, which carries what m_A says, lost the famous people the
anchor alone answers (3/20 expected words with the bridge, 8/20 without; seventeenth session). Here m_A also reads the
true home towns of real famous people in the world's own phrasings, so that what it learns is "a name I never read
about is unknown", not "any name outside the world is unknown". None of these people is one the evaluation asks
(probe_forms.FAMOUS: a test checks it); `probe_famous` asks m_A alone about those.
"""
from __future__ import annotations

import torch

from . import world as W

KNOWN_FAMOUS = [  # (name, home town): birthplaces as encyclopedias give them
    ("Johann Wolfgang von Goethe", "Frankfurt"), ("Friedrich Schiller", "Marbach"), ("Karl Marx", "Trier"),
    ("Immanuel Kant", "Königsberg"), ("Franz Kafka", "Prague"), ("Dante Alighieri", "Florence"),
    ("Christopher Columbus", "Genoa"), ("Marco Polo", "Venice"), ("Antonio Vivaldi", "Venice"),
    ("Giacomo Puccini", "Lucca"), ("Joseph Haydn", "Rohrau"), ("Franz Schubert", "Vienna"),
    ("Richard Wagner", "Leipzig"), ("Robert Schumann", "Zwickau"), ("Johannes Brahms", "Hamburg"),
    ("Felix Mendelssohn", "Hamburg"), ("George Frideric Handel", "Halle"), ("Martin Luther", "Eisleben"),
    ("Albrecht Dürer", "Nuremberg"), ("Victor Hugo", "Besançon"), ("Jules Verne", "Nantes"),
    ("Louis Pasteur", "Dole"), ("Miguel de Cervantes", "Alcalá de Henares"), ("Salvador Dalí", "Figueres"),
    ("Antoni Gaudí", "Reus"), ("Hans Christian Andersen", "Odense"), ("Søren Kierkegaard", "Copenhagen"),
    ("Henrik Ibsen", "Skien"), ("Alfred Nobel", "Stockholm"), ("Fyodor Dostoevsky", "Moscow"),
    ("Pyotr Ilyich Tchaikovsky", "Votkinsk"), ("Vladimir Lenin", "Simbirsk"), ("Nicolaus Copernicus", "Toruń"),
    ("John Lennon", "Liverpool"), ("Paul McCartney", "Liverpool"), ("Charles Dickens", "Portsmouth"),
    ("Jane Austen", "Steventon"), ("Oscar Wilde", "Dublin"), ("James Joyce", "Dublin"), ("Robert Burns", "Alloway"),
    ("Alexander Graham Bell", "Edinburgh"), ("Arthur Conan Doyle", "Edinburgh"), ("Agatha Christie", "Torquay"),
    ("Martin Luther King Jr.", "Atlanta"), ("Ernest Hemingway", "Oak Park"), ("Bob Dylan", "Duluth"),
    ("Louis Armstrong", "New Orleans"), ("Frank Sinatra", "Hoboken"), ("Marilyn Monroe", "Los Angeles"),
    ("Steve Jobs", "San Francisco"), ("Bill Gates", "Seattle"), ("Muhammad Ali", "Louisville"),
    ("Michael Jackson", "Gary"), ("John F. Kennedy", "Brookline"), ("Benjamin Franklin", "Boston"),
    ("Edgar Allan Poe", "Boston"), ("Amelia Earhart", "Atchison"), ("Neil Armstrong", "Wapakoneta"),
    ("Frida Kahlo", "Coyoacán"), ("Gabriel García Márquez", "Aracataca"), ("Jorge Luis Borges", "Buenos Aires"),
    ("Simón Bolívar", "Caracas"), ("Che Guevara", "Rosario"), ("Mao Zedong", "Shaoshan"),
    ("Akira Kurosawa", "Tokyo"), ("Ludwig Wittgenstein", "Vienna"), ("Niels Bohr", "Copenhagen"),
    ("Max Planck", "Kiel"), ("Werner Heisenberg", "Würzburg"), ("Johannes Kepler", "Weil der Stadt"),
    ("Alexander the Great", "Pella"), ("Archimedes", "Syracuse"), ("Aristotle", "Stagira"),
    ("Diego Maradona", "Lanús"), ("Arnold Schwarzenegger", "Thal"), ("Wolfgang Pauli", "Vienna"),
]


def facts(count: int) -> list[list[tuple[str, str]]]:
    """m_A's training entries for the first `count` famous people, in world.fact_phrasings' form."""
    return [[(pre.format(x=name).rstrip(), " " + town + post) for pre, post in W.FACTS["town"]]
            for name, town in KNOWN_FAMOUS[:count]]


@torch.no_grad()
def probe_famous(model, tok, new_tokens: int = 6) -> dict:
    """m_A alone, greedy after "NAME was born in", on the evaluation's famous people (probe_forms.FAMOUS): how many
    answers hold an expected word, and how many say "an unknown" (what it was taught for names outside the world)."""
    from .probe_forms import FAMOUS

    prompts = [W.COMPLETION["town"].format(x=name) for name, _ in FAMOUS]
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    ids = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    answers = [a.strip() for a in tok.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)]
    return {"famous_expected": sum(any(w in a for w in words) for a, (_, words) in zip(answers, FAMOUS)),
            "famous_said_unknown": sum(a.startswith("an unknown") for a in answers), "famous_asked": len(FAMOUS),
            "famous_examples": [f"{n} was born in {a}" for (n, _), a in list(zip(FAMOUS, answers))[:4]]}
