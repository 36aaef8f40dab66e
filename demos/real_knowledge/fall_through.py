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
from .recipe_comparison import PRESET, dev_scores, preset_world, train_through_app

UNKNOWN = re.compile(r"^(?P<name>.+) was born in an unknown town\.<\|im_end\|>$")


def anchor_finishes(calm, rows: list[dict], new_tokens: int = 16) -> list[dict]:
    """The invented-name rows answered "NAME was born in" + the anchor alone's greedy continuation, to the end of its
    first sentence (its first line, cut after the first full stop)."""
    asked = [(i, UNKNOWN.match(r["completion"]).group("name")) for i, r in enumerate(rows)
             if UNKNOWN.match(r["completion"])]
    starts = [rows[i]["prompt"] + f"{name} was born in" for i, name in asked]
    said = []
    with calm.gate_scale(0.0):  # the anchor exactly
        for b in range(0, len(starts), 32):
            said += calm.generate(starts[b:b + 32], max_new_tokens=new_tokens)
    out = [dict(r) for r in rows]
    for (i, name), more in zip(asked, said):
        line = more.split("\n")[0]
        ended = "." in line
        line = line[:line.index(".") + 1] if ended else line.rstrip()
        out[i]["completion"] = f"{name} was born in{line}" + ("<|im_end|>" if ended else "")
        out[i]["anchor_finishes"] = True
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--rows", choices=["anchor_finishes", "not_recorded"], default="anchor_finishes",
                        help="how the invented-name rows are answered (not_recorded: as the shipped preset)")
    parser.add_argument("--people", type=int, default=40)
    parser.add_argument("--unknown", type=int, default=60)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    world = preset_world()
    lab = LabSession()
    lab.use_preset("real_knowledge")
    with open(PRESET / "data" / "composition_train.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if args.rows == "anchor_finishes":
        rows = anchor_finishes(lab.calm, rows)
    out = Path(args.out)
    train_s = train_through_app(lab, rows, out)
    started = time.perf_counter()
    known = G.held_out(lab.calm, world, args.people, 24, split="dev")
    unknown = G.unknown(lab.calm, world, args.unknown, 24, split="dev")
    general = G.general(lab.calm, 24)
    result = {"rows": args.rows, "train_rows": len(rows), "train_s": round(train_s, 1), "message": lab.run.message,
              **dev_scores(known, unknown), "general_ratio": general["ratio"],
              "general_expected_on": general["expected_on"], "general_expected_off": general["expected_off"],
              "eval_s": round(time.perf_counter() - started, 1)}
    out.write_text(json.dumps({**result, "known": known, "unknown": unknown, "general": general,
                               "unknown_rows": [r for r in rows if r.get("anchor_finishes")][:10]}, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "message"}))
    return result


if __name__ == "__main__":
    main()
