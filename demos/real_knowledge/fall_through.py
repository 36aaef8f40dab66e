"""Invented-name rows that start the answer's sentence and let the anchor finish it (issue 39, item 2).

The shipped preset answers its 100 invented-name rows "NAME was born in an unknown town.": the bridge carries m_A's
"unknown" into the answer, which keeps most invented towns out (18% of answers about invented names still name a
world town) but also answers famous people "unknown" (3/20 expected words with the bridge, 8/20 without: m_A, taught
names outside the world as unknown, calls them unknown too). Here the same rows are answered "NAME was born in" and
then the anchor alone's own greedy continuation of that sentence. The decision then falls where m_A's knowledge
shows: at "was born in" m_A predicts a town or "an unknown town", and the bridge is trained to copy the first and to
write nothing on the second, so that the anchor finishes the sentence as it would alone.

    python -m demos.real_knowledge.fall_through results/real_knowledge/fall_through/anchor_finishes.json
    python -m demos.real_knowledge.fall_through --rows not_recorded results/real_knowledge/fall_through/shipped_rows.json
    python -m demos.real_knowledge.fall_through --rows famous_rehearsal results/real_knowledge/fall_through/famous.json

famous_rehearsal keeps the shipped rows and adds the same invented-name questions asked about real famous people
(none of them in the evaluation), answered as the anchor alone answers (keep_anchor rows): the bridge is to leave to
the anchor the people the anchor knows, which m_A calls unknown.

Both train through the app's calls (LabSession: the preset's recipe and settings, Start over, Train) on the preset's
own training rows, the invented-name rows' answers the only difference; both are scored on development people and
forms and development invented names only (generalisation.held_out / unknown, split dev), and on the general prompts.
About 10 minutes of training and 15 of scoring each on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch

from calm_core.lab import LabSession

from . import generalisation as G
from . import probe_forms as P
from .recipe_comparison import PRESET, dev_scores, preset_world, train_through_app

UNKNOWN = re.compile(r"^(?P<name>.+) was born in an unknown town\.<\|im_end\|>$")


def anchor_says(calm, prompts: list[str], new_tokens: int) -> list[tuple[str, bool]]:
    """The anchor alone's greedy answers (32 at a time), each cut to its first sentence: (its first line up to and with
    the first full stop, or the whole line without trailing spaces; whether a full stop ended it)."""
    said = []
    with calm.gate_scale(0.0):  # the anchor exactly
        for b in range(0, len(prompts), 32):
            said += calm.generate(prompts[b:b + 32], max_new_tokens=new_tokens)
    cut = []
    for answer in said:
        line = answer.split("\n")[0]
        ended = "." in line
        cut.append((line[:line.index(".") + 1] if ended else line.rstrip(), ended))
    return cut


def anchor_finishes(calm, rows: list[dict], new_tokens: int = 16) -> list[dict]:
    """The invented-name rows answered "NAME was born in" + the anchor alone's greedy continuation, to the end of its
    first sentence (its first line, cut after the first full stop)."""
    asked = [(i, UNKNOWN.match(r["completion"]).group("name")) for i, r in enumerate(rows)
             if UNKNOWN.match(r["completion"])]
    said = anchor_says(calm, [rows[i]["prompt"] + f"{name} was born in" for i, name in asked], new_tokens)
    out = [dict(r) for r in rows]
    for (i, name), (line, ended) in zip(asked, said):
        out[i]["completion"] = f"{name} was born in{line}" + ("<|im_end|>" if ended else "")
        out[i]["anchor_finishes"] = True
    return out


def famous_rehearsal(calm, rows: list[dict], new_tokens: int = 24, count: int | None = None, ask=None) -> list[dict]:
    """The rows, plus each invented-name question asked again about a real famous person (famous_known.KNOWN_FAMOUS,
    none of whom the evaluation asks) as a keep_anchor row answered as the anchor alone answers: m_A calls famous
    people "unknown" too, and these rows teach the bridge to leave to the anchor the names the anchor knows (its
    queries are the anchor's own states, which do know them). count: only the first `count` such questions.
    ask(i, name): the i-th question's prompt instead (e.g. in the trained forms), `count` of them (default: as many)."""
    from .famous_known import KNOWN_FAMOUS

    asked = [(r, UNKNOWN.match(r["completion"]).group("name")) for r in rows if UNKNOWN.match(r["completion"])][:count]
    famous = lambda i: KNOWN_FAMOUS[i % len(KNOWN_FAMOUS)][0]  # noqa: E731
    prompts = [r["prompt"].replace(name, famous(i)) for i, (r, name) in enumerate(asked)] if ask is None else \
        [ask(i, famous(i)) for i in range(count or len(asked))]
    extra = []
    for prompt, (line, ended) in zip(prompts, anchor_says(calm, prompts, new_tokens)):
        line = line.lstrip()
        if line:
            extra.append({"prompt": prompt, "completion": line + ("<|im_end|>" if ended else ""), "keep_anchor": True,
                          "famous": True})
    return rows + extra


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--rows", choices=["anchor_finishes", "famous_rehearsal", "not_recorded"], default="anchor_finishes",
                        help="how the invented-name rows are answered (not_recorded: as the shipped preset; "
                             "famous_rehearsal: as shipped, plus the same questions about real famous people "
                             "answered as the anchor answers)")
    parser.add_argument("--famous-rows", type=int, help="famous_rehearsal: at most this many famous-person rows")
    parser.add_argument("--famous-forms", choices=["asked", "trained"], default="asked",
                        help="famous_rehearsal: the invented-name questions' wording, or the preset's trained forms")
    parser.add_argument("--people", type=int, default=40)
    parser.add_argument("--unknown", type=int, default=60)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    world = preset_world()
    lab = LabSession()
    lab.use_preset("real_knowledge")
    with open(PRESET / "data" / "composition_train.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if args.rows == "famous_rehearsal":
        forms, tok = world["question_forms"]["town"], lab.calm.anchor.tokenizer
        ask = None if args.famous_forms == "asked" else lambda i, name: P.chat_prompt(tok, [forms[i % len(forms)]], name)
        rows = famous_rehearsal(lab.calm, rows, count=args.famous_rows, ask=ask)
    elif args.rows == "anchor_finishes":
        rows = anchor_finishes(lab.calm, rows)
    out = Path(args.out)
    train_s = train_through_app(lab, rows, out)
    started = time.perf_counter()
    known = G.held_out(lab.calm, world, args.people, 24, split="dev")
    unknown = G.unknown(lab.calm, world, args.unknown, 24, split="dev")
    general = G.general(lab.calm, 24)
    result = {"rows": args.rows, "famous_forms": args.famous_forms, "train_rows": len(rows),
              "train_s": round(train_s, 1), "message": lab.run.message,
              **dev_scores(known, unknown), "general_ratio": general["ratio"],
              "general_expected_on": general["expected_on"], "general_expected_off": general["expected_off"],
              "eval_s": round(time.perf_counter() - started, 1)}
    out.write_text(json.dumps({**result, "known": known, "unknown": unknown, "general": general,
                               "changed_rows": [r for r in rows if r.get("anchor_finishes") or r.get("famous")][:10]},
                              indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "message"}))
    return result


if __name__ == "__main__":
    main()
