"""Two calm_core recipes on the real pair, like for like, through the app's own calls (LabSession).

    python -m demos.real_knowledge.recipe_comparison knowledge-sentence results/real_knowledge/recipe_comparison/sentence.json
    python -m demos.real_knowledge.recipe_comparison knowledge-varied results/real_knowledge/recipe_comparison/varied.json

The same plain data for both: the shipped preset's 200 composition people in its 3 trained forms (answer
"NAME was born in TOWN."), plus its 96 rehearsal rows; the same steps (90), m_A (the preset's adapter) and
validation file. Scored on the 40 first development people in the trained forms and the 8 development forms
(generalisation.held_out, split dev), and on 60 development invented names and the 20 famous people
(generalisation.unknown, split dev): no test person or reported form is used. About 10 + 16 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from calm_core.lab import LabSession

from . import generalisation as G
from . import probe_forms as P

PRESET = Path(__file__).resolve().parents[2] / "presets" / "real_knowledge"


def plain_rows(world: dict, tok) -> list[dict]:
    """The composition people in the trained forms, and the preset's rehearsal rows."""
    rows = [{"prompt": P.chat_prompt(tok, [form], p["name"]), "completion": f"{p['name']} was born in {p['town']}.<|im_end|>"}
            for p in world["people"] if p["split"] == "compose" for form in world["question_forms"]["town"]]
    with open(PRESET / "data" / "composition_train.jsonl") as f:
        return rows + [r for r in map(json.loads, f) if r.get("keep_anchor")]


def preset_world() -> dict:
    """The shipped preset's world, with its trained question forms."""
    preset = json.loads((PRESET / "preset.json").read_text())
    return {**json.loads((PRESET / "world.json").read_text()), "question_forms": preset["question_forms"]}


def train_through_app(lab, rows: list[dict], out: Path, recipe: str | None = None, steps: int | None = None) -> float:
    """Start over and train on `rows` (written beside `out`) as the app does, the preset's validation file kept;
    the seconds from pressing Train to the end."""
    data = out.with_suffix(".data.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lab.set_data(data, validation_path=PRESET / "data" / "composition_validation.jsonl")
    lab.reset_bridge()
    if recipe:
        lab.set_recipe(recipe)
    started = time.perf_counter()
    lab.start_training(lab.train_config(**({"steps": steps} if steps else {})))
    lab.wait()
    return time.perf_counter() - started


def dev_scores(known: dict, unknown: dict) -> dict:
    """The summary of generalisation.held_out / unknown on the development split."""
    scores = {"trained_forms_named": known[G.TRAINED]["named_on"],
              "dev_forms_named": {k: v["named_on"] for k, v in known.items() if k != G.TRAINED},
              "invented_on": unknown["invented"]["invented_on"], "invented_off": unknown["invented"]["invented_off"],
              "famous_expected_on": unknown["famous"]["expected_on"],
              "famous_expected_off": unknown["famous"]["expected_off"]}
    scores["dev_forms_mean"] = sum(scores["dev_forms_named"].values()) / len(scores["dev_forms_named"])
    return scores


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=90)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    world = preset_world()
    lab = LabSession()
    lab.use_preset("real_knowledge")
    rows = plain_rows(world, lab.calm.anchor.tokenizer)
    train_s = train_through_app(lab, rows, Path(args.out), args.recipe, args.steps)
    started = time.perf_counter()
    known = G.held_out(lab.calm, world, 40, 24, split="dev")
    unknown = G.unknown(lab.calm, world, 60, 24, split="dev")
    result = {"recipe": args.recipe, "rows": len(rows), "steps": args.steps, "train_s": round(train_s, 1),
              "message": lab.run.message, **dev_scores(known, unknown),
              "eval_s": round(time.perf_counter() - started, 1)}
    Path(args.out).write_text(json.dumps({**result, "known": known, "unknown": unknown}, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "message"}))
    return result


if __name__ == "__main__":
    main()
