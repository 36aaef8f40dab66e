"""Whose mistake is it: m_A's, or the composition's? Each wrong answer traced back to what m_A itself predicted.

    python -m demos.real_knowledge.invention_source RUN_DIR                 # 100 invented names, 100 held-out people
    python -m demos.real_knowledge.invention_source RUN_DIR --split dev     # other names, development people
    python -m demos.real_knowledge.invention_source RUN_DIR --split dev --gate-scale 1.5   # a louder bridge, untrained

The bridge reads m_A's states over the very text the anchor writes (the chat prompt and the answer so far, in m_A's
own tokens). So for every answer that goes wrong, m_A alone is run on that text cut just before the wrong word (the
invented town, or the "an" of "an unknown town") and asked what it would say next:
- an invented name answered with a world town: the invention is **m_A's** when m_A there puts more probability on the
  world's towns than on "an" (what it was taught to say for names outside the world), else the **composition's**
  (m_A said "unknown" and the bridge did not carry it);
- a held-out person answered with "an unknown town" or another town: **m_A's** when m_A's most likely next word
  there is not the person's town, else the **composition's**.
A fix belongs where the mistakes are: more outside names for m_A, or more or heavier invented-name rows for the
bridge (README, twenty-third session). Writes RUN/invention_source[_dev].json and .md.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from . import probe_forms as P
from .generalisation import ask, first_town, general, load, unknown_asked
from .not_recorded import value as unknown_value

UNKNOWN_PHRASE = " ".join(unknown_value().split()[:2])  # "an unknown": what the answer says for a name m_A never read
UNKNOWN_WORD = " " + UNKNOWN_PHRASE.split()[0]  # " an": its first token, where m_A chooses it over a town


def first_tokens(tok, towns: list[str]) -> tuple[int, dict[str, int]]:
    """m_A's token ids of " an" and of each town's first token (after a space, as in "was born in TOWN")."""
    first = lambda word: tok(word, add_special_tokens=False).input_ids[0]  # noqa: E731
    return first(UNKNOWN_WORD), {t: first(" " + t) for t in towns}


@torch.no_grad()
def next_word(m_a, tok, text: str, unknown_id: int, first: dict[str, int]) -> dict:
    """m_A alone after `text`: P("an"), P(any world town's first token) and its most likely town."""
    enc = tok(text, return_tensors="pt")  # with its BOS, as the composition encodes m_A's text
    probs = m_a(**enc).logits[0, -1].float().softmax(-1)
    best = max(first, key=lambda t: float(probs[first[t]]))
    return {"p_unknown": float(probs[unknown_id]), "p_towns": float(sum(probs[i] for i in set(first.values()))),
            "top_town": best, "p_top_town": float(probs[first[best]])}


def cut_before(answer: str, word: str) -> str:
    """The answer up to (not including) the space before `word`'s first occurrence: what was written when it was chosen."""
    return answer[:answer.index(word)].rstrip()


def source_of(kind: str, town: str | None, seen: dict) -> str:
    """"m_A" when m_A's own next word was wrong too, else "composition" (module docstring)."""
    if kind == "unknown":
        return "m_A" if seen["p_towns"] > seen["p_unknown"] else "composition"
    right = seen["top_town"] == town and seen["p_top_town"] > seen["p_unknown"]
    return "composition" if right else "m_A"


def trace(calm, world: dict, count: int, people: int, split: str = "test", new_tokens: int = 16) -> dict:
    """Composed answers for invented names and held-out people (each form in turn), with each wrong one's source."""
    tok, towns = calm.anchor.tokenizer, world["towns"]
    m_a, m_tok = calm.augments[0].model, calm.augments[0].tokenizer
    unknown_id, first = first_tokens(m_tok, towns)
    forms, invented = unknown_asked(world, count, split)  # the names and forms generalisation.unknown asks
    known = [p for p in world["people"] if p["split"] == split][:people]
    cases = ([("unknown", n, None, forms[i % len(forms)]) for i, n in enumerate(invented)]
             + [("known", p["name"], p["town"], forms[i % len(forms)]) for i, p in enumerate(known)])
    prompts = [P.chat_prompt(tok, t, n) for _, n, _, t in cases]
    answers = ask(calm, prompts, new_tokens, off=False)["on"]
    rows = []
    for (kind, name, town, turns), prompt, got in zip(cases, prompts, answers):
        line = got.split("\n")[0]
        named = first_town(line, towns)
        if kind == "unknown":
            wrong = named  # any world town is an invention
        elif named != town:  # another town, or "an unknown town" (None: no word chose a town)
            wrong = named or (UNKNOWN_PHRASE if UNKNOWN_PHRASE in line else None)
        else:
            wrong = None
        row = {"kind": kind, "name": name, "question": P.question_text(turns, name), "answer": line, "town": town}
        if wrong:
            seen = next_word(m_a, m_tok, prompt + cut_before(line, wrong), unknown_id, first)
            row.update(wrong=wrong, source=source_of(kind, town, seen), **seen)
        elif kind == "known" and named != town:
            row.update(wrong="no town", source="untraced")  # nothing to cut before: no word chose the town
        rows.append(row)
    return summary(rows)


def summary(rows: list[dict]) -> dict:
    out = {"rows": rows}
    for kind in ("unknown", "known"):
        mine = [r for r in rows if r["kind"] == kind]
        wrong = [r for r in mine if r.get("wrong")]
        out[kind] = {"asked": len(mine), "wrong": len(wrong),
                     "m_A": sum(r["source"] == "m_A" for r in wrong),
                     "composition": sum(r["source"] == "composition" for r in wrong),
                     "untraced": sum(r["source"] == "untraced" for r in wrong),
                     # the composition's mistakes that name the town m_A itself ranked first among the towns: the
                     # bridge carried m_A's runner-up past its "an"
                     "m_A_top_town": sum(r["source"] == "composition" and r["wrong"] == r.get("top_town") for r in wrong)}
    return out


def markdown(result: dict, folder: str) -> str:
    u, k = result["unknown"], result["known"]
    scale = result.get("gate_scale", 1.0)
    louder = (f", the bridge's contributions x{scale:g} (perplexity ratio on general prompts "
              f"{result['general']['ratio']:.3f})" if scale != 1.0 and "general" in result else "")
    lines = [f"# Whose mistake: `{folder}` ({result['split']} split{louder})", "",
             "| asked | wrong | m_A's own prediction there was wrong too (m_A's) | m_A was right, the composed answer not (the composition's) |",
             "|---|---|---|---|",
             f"| {u['asked']} invented names: a world town named | {u['wrong']} | {u['m_A']} | {u['composition']} |",
             f"| {k['asked']} held-out people: another town, \"an unknown town\" or no town ({k['untraced']}) | {k['wrong']} "
             f"| {k['m_A']} | {k['composition']} |",
             "", f"Of the composition's {u['composition']} inventions, {u['m_A_top_town']} name the very town m_A ranked first "
             "among the towns there (its runner-up to \"an\"; when most do, the bridge carried m_A's ranking with \"an\" "
             "too weak).",
             "", "| kind | question | composed answer | m_A there: P(an) / P(world towns), its town | source |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        if r.get("source") in ("m_A", "composition"):
            lines.append(f"| {r['kind']} | {r['question']} | {r['answer']} | {r['p_unknown']:.2f} / {r['p_towns']:.2f}, "
                         f"{r['top_town']} | {r['source']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="a run or preset folder (world.json, adapter/, bridge/)")
    ap.add_argument("--unknown", type=int, default=100, help="invented names asked")
    ap.add_argument("--people", type=int, default=100, help="held-out people asked")
    ap.add_argument("--split", choices=("test", "dev"), default="test")
    ap.add_argument("--gate-scale", type=float, default=1.0,
                    help="every bridge contribution scaled by this while asking (1: as trained): does a louder bridge "
                         "carry m_A's \"an\"? The general prompts' perplexity ratio is then measured at that scale too")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.time()
    calm, world = load(args.folder)
    with calm.gate_scale(args.gate_scale):
        result = trace(calm, world, args.unknown, args.people, args.split)
        if args.gate_scale != 1.0:
            result["general"] = general(calm, 24)
    result.update(split=args.split, gate_scale=args.gate_scale, seconds=round(time.time() - start, 1))
    stem = ("invention_source" + ("_dev" if args.split == "dev" else "")
            + (f"_gate{args.gate_scale:g}" if args.gate_scale != 1.0 else ""))
    (args.folder / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (args.folder / f"{stem}.md").write_text(markdown(result, str(args.folder)))
    print(markdown(result, str(args.folder)).split("\n\n")[1])


if __name__ == "__main__":
    main()
