"""Names m_A never read about, taught as such: m_A's own "not recorded", which the bridge then carries.

The bridge reads m_A's next-token prediction where the answer says "NAME was born in". An m_A trained on the world's
facts alone names a world town there for any name at all (for invented names a median probability of 0.71, 98% of
its mass on world towns): it does not know what it does not know, and the bridge carries the invention. Here m_A
also reads sentences about names outside the world whose home town is not recorded ("NAME was born in an unknown
town."), so that a name it never read about makes it predict " an", not a town; the bridge's value path carries
that token like any other, and the composed answer says the town is unknown instead of inventing one.

The outside names come from a stream of their own: none is an evaluation name (probe_forms.unknown_names, seed 0)
or one of the bridge's invented-name rows (phrasings.unknown_questions).
"""
from __future__ import annotations

import json

import torch

from . import world as W

# (prefix, value + suffix) per phrasing, as world.FACTS; the value's first token is never a town's
NOT_RECORDED = [("{x} was born in", " an unknown town."), ("{x} comes from", " an unknown town."),
                ("The home town of {x} is", " unknown.")]
EVALUATION_NAMES = 400  # the first names of probe_forms.unknown_names(world, n) (seed 0): test and development
BRIDGE_NAMES = 500  # the most invented-name rows a bridge may ask (Settings.unknown_rows); all kept out of m_A's


def value() -> str:
    """The words after "was born in" for a name outside the world ("an unknown town.")."""
    return NOT_RECORDED[0][1].strip()


def sentence(name: str) -> str:
    """The answer for a name m_A never read about, in the trained answers' form ("NAME was born in TOWN.")."""
    pre, value = NOT_RECORDED[0]
    return pre.format(x=name) + value


def outside_names(world: W.World, count: int, seed: int) -> list[str]:
    """`count` invented names, no person or town of the world, none asked in evaluation or in the bridge's rows."""
    from .phrasings import unknown_questions
    from .probe_forms import unknown_names

    taken = set(unknown_names(world, EVALUATION_NAMES)) | {n for n, _ in unknown_questions(world, BRIDGE_NAMES, seed)}
    return [n for n in unknown_names(world, count + len(taken), seed=2000 + seed) if n not in taken][:count]


def facts(world: W.World, count: int, seed: int) -> list[list[tuple[str, str]]]:
    """m_A's training entries for `count` outside names, in world.fact_phrasings' form."""
    return [[(pre.format(x=name), value) for pre, value in NOT_RECORDED] for name in outside_names(world, count, seed)]


@torch.no_grad()
def probe(model, tok, world: W.World, known: list[str], unknown: list[str], new_tokens: int = 4,
          batch_size: int = 32) -> dict:
    """m_A alone, greedy after "NAME was born in": % of known people given their own town, % of unknown names
    given a world town (an invention) and % given "an unknown..." (what it was taught for outside names)."""
    town_of = {p.name: p.town for p in world.people}
    towns = set(world.towns)
    out = {}
    for kind, names in (("known", known), ("unknown", unknown)):
        answers = []
        for i in range(0, len(names), batch_size):
            prompts = [W.COMPLETION["town"].format(x=n) for n in names[i:i + batch_size]]
            enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
            ids = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
            answers += tok.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        # m_A was trained on the value alone (no full stop): after the town it may go on spelling, so a town
        # counts when the answer starts with it
        answers = [a.strip() for a in answers]
        if kind == "known":
            out["known_right"] = 100.0 * sum(a.startswith(town_of[n]) for a, n in zip(answers, names)) / max(1, len(names))
        else:
            out["unknown_invented"] = 100.0 * sum(any(a.startswith(t) for t in towns) for a in answers) / max(1, len(names))
            out["unknown_said_unknown"] = 100.0 * sum(a.startswith("an unknown") for a in answers) / max(1, len(names))
        out[f"{kind}_examples"] = [f"{n} was born in {a}" for n, a in list(zip(names, answers))[:4]]
    return out


def extra_facts(s, world: W.World) -> list[list[tuple[str, str]]]:
    """What m_A reads beside the world: `s.augment_unknown` names outside it as unknown, and `s.augment_famous` real
    famous people with their true home towns (famous_known.py), so that "unknown" stays for names it never read."""
    from .famous_known import facts as famous

    return (facts(world, s.augment_unknown, s.seed) if s.augment_unknown else []) + famous(s.augment_famous)


def second_stage(s) -> dict:
    """train_lora's settings for the stage in which an m_A that has learned the world reads the outside names beside
    it (`s.augment_unknown_epochs`; the shipped preset's m_A: 4 epochs, no focused start, a 2-epoch anneal)."""
    return {"max_epochs": s.augment_unknown_epochs, "focus_epochs": 0, "anneal_epochs": min(2, s.augment_unknown_epochs)}


def probe_run(model, tok, data: dict, count: int = 100) -> dict:
    """`probe` for a run: its development people, and invented names of the evaluation stream that neither
    generalisation split asks (probe_forms.unknown_names 200-299)."""
    from .augment import log
    from .probe_forms import unknown_names

    world = data["world"]
    result = probe(model, tok, world, [p.name for p in data["parts"]["dev"][:count]], unknown_names(world, 300)[200:200 + count])
    from .famous_known import probe_famous

    result.update(probe_famous(model, tok))  # the evaluation's famous people, m_A alone
    log("m_A probe", json.dumps(result))
    return result
