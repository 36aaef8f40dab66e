"""One table for the fresh worlds: each run folder a row, and the spread (min / median / max) under the headline.

    python -m demos.real_knowledge.fresh_worlds results/real_knowledge/seed9 results/real_knowledge/seed10 \
        results/real_knowledge/seed11 --out results/real_knowledge/fresh_worlds_shipped.md

A folder is a pipeline run (table.json) that `generalisation.py` has also scored (generalisation.json): the held-out
people in the trained forms (the table's 300: exact match, or the town named where the answer is a sentence), the 11
never-trained forms (60 people each, the town named), invented names answered with a world town, famous people's
expected words, the perplexity ratio on general prompts, and the times. A world whose settings were chosen on it is
no fresh world: say so beside its row.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

HELD_OUT = "exact match %, held-out entities"
TRAINED = "trained forms"


def world_row(folder: Path) -> dict:
    """The numbers one fresh world reports, from its table.json and generalisation.json."""
    table = json.loads((folder / "table.json").read_text())
    gen = json.loads((folder / "generalisation.json").read_text())
    never = {name: r["named_on"] for name, r in gen["held_out"].items() if name != TRAINED}
    lowest = min(never, key=never.get)
    times = table.get("times_s", {})
    augment = table.get("augment", {})
    return {
        "seed": table["settings"]["seed"],
        "held_out": table["table"][HELD_OUT]["CALM"],
        "anchor_alone": table["table"][HELD_OUT]["anchor alone"],
        "m_a_chat": table["table"][HELD_OUT].get("m_A alone (chat question)"),
        "trained_named": gen["held_out"][TRAINED]["named_on"],
        "never_trained": sum(never.values()) / len(never),
        "lowest_form": (lowest, never[lowest]),
        "invented": gen["unknown"]["invented"]["invented_on"],
        "invented_off": gen["unknown"]["invented"]["invented_off"],
        "famous": (gen["unknown"]["famous"]["expected_on"], gen["unknown"]["famous"]["expected_off"],
                   gen["unknown"]["famous"]["asked"]),
        "ratio": gen["general"]["ratio"],
        "m_a_alone_invents": augment.get("probe", {}).get("unknown_invented"),
        "augment_min": times.get("augment_train_s", 0) / 60, "bridge_min": times.get("bridge_train_s", 0) / 60,
    }


def spread(values: list[float], digits: int = 1) -> str:
    """min / median / max."""
    return " / ".join(f"{v:.{digits}f}" for v in (min(values), statistics.median(values), max(values)))


def markdown(rows: list[dict]) -> str:
    lines = ["| world seed | held out, trained forms (300 people) | trained forms, town named (60) | 11 never-trained "
             "forms (lowest) | invented names -> a world town (m_A alone) | famous: expected word, on / off | "
             "perplexity ratio | m_A + bridge training |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        form, low = r["lowest_form"]
        alone = f" ({r['m_a_alone_invents']:.0f}%)" if r["m_a_alone_invents"] is not None else ""
        on, off, asked = r["famous"]
        lines.append(f"| {r['seed']} | {r['held_out']:.1f} | {r['trained_named']:.1f} | {r['never_trained']:.1f} "
                     f"({form}: {low:.1f}) | {r['invented']:.0f}%{alone} | {on} / {off} of {asked} | "
                     f"{r['ratio']:.3f} | {r['augment_min']:.1f} + {r['bridge_min']:.1f} min |")
    lines += ["", "Spread over the worlds, min / median / max: held out " + spread([r["held_out"] for r in rows])
              + "; never-trained forms " + spread([r["never_trained"] for r in rows]) + "; invented names "
              + spread([r["invented"] for r in rows]) + "%; perplexity ratio " + spread([r["ratio"] for r in rows], 3) + ".",
              "The anchor alone: " + ", ".join(f"{r['anchor_alone']:.1f}%" for r in rows) + " held out; invented "
              "names with the bridge off: " + ", ".join(f"{r['invented_off']:.0f}%" for r in rows) + ". m_A alone: "
              "after 'NAME was born in', 100 other invented names (its probe when trained). The never-trained forms "
              "and the unknown people: generalisation.py (60 held-out people a form, 100 invented names, 20 famous)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", help="run folders holding table.json and generalisation.json")
    ap.add_argument("--out", default=None, help="write the table here (markdown) and beside it as .json")
    args = ap.parse_args(argv)
    rows = [world_row(Path(f)) for f in args.folders]
    text = markdown(rows)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(text)


if __name__ == "__main__":
    main()
