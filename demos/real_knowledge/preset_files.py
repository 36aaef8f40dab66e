"""The files a run writes beside its table: the data sets, the world with its splits, and preset.json (the app's
real-knowledge preset: the real pair by key, m_A's adapter and the bridge as files here)."""
from __future__ import annotations

import json
from pathlib import Path

from . import report
from . import world as W
from .scoring import trained_answer, with_expected, write_jsonl

PAIR_ROWS = ("prompt", "completion")
SENTENCE_TOKENS = 24  # 'NAME was born in TOWN.' + end of turn: up to 19 SmolLM2 tokens in world 5


def write_data(out: Path, s, data: dict) -> None:
    """world.json (every person, their values and their split) and data/*.jsonl."""
    split_of = {p.name: name for name, people in data["parts"].items() for p in people}
    world = data["world"].to_dict()
    for person in world["people"]:
        person["split"] = split_of[person["name"]]
    world.update(attributes=list(s.attributes), question_forms={a: W.QUESTIONS[a] for a in s.attributes},
                 encyclopedia_phrasings={a: [pre + "{value}" + post for pre, post in W.FACTS[a]] for a in s.attributes},
                 splits={"compose": "questions about them trained the bridge", "dev": "chose the settings and "
                         "the early stopping", "test": "held out: in no composition data, reported"})
    (out / "world.json").write_text(json.dumps(world, indent=1))
    d = out / "data"
    (d / "encyclopedia.txt").parent.mkdir(parents=True, exist_ok=True)
    (d / "encyclopedia.txt").write_text("".join(f"{pre}{val}\n" for phr in data["facts"] for pre, val in phr))
    # keep_anchor: the rehearsal rows, trained toward the anchor alone (calm_core.training.data reads the column)
    write_jsonl(d / "composition_train.jsonl", [dict(r, keep_anchor=r.get("keep_anchor", False)) for r in data["compose"]],
                PAIR_ROWS + ("keep_anchor",))
    write_jsonl(d / "composition_validation.jsonl", as_written(data["dev"], s), PAIR_ROWS + _value(s))
    write_jsonl(d / "eval_heldout.jsonl", as_written(data["test"], s), PAIR_ROWS + _value(s))
    write_jsonl(d / "eval_general.jsonl", data["general"], PAIR_ROWS)
    # the rows trained toward the anchor alone (invented-name rows answered "... an unknown town." are not)
    write_jsonl(d / "rehearsal.jsonl", [r for r in data["rehearsal"] if not r.get("not_recorded")], ("question",) + PAIR_ROWS)


def as_written(rows: list[dict], s) -> list[dict]:
    """Question rows as the files hold them: the completion is the answer the bridge was trained to write (the
    town, or with answer_style "sentence" the whole sentence, the town kept in a "value" column for scoring), so
    the app's exact match and loss score the same target as the run."""
    if getattr(s, "answer_style", "town") != "sentence":
        return rows
    return [dict(r, completion=trained_answer(r["completion"], r["entity"], s.answer_style).strip(), value=r["completion"])
            for r in rows]


def _value(s) -> tuple:
    return ("value",) if getattr(s, "answer_style", "town") == "sentence" else ()


def train_settings(settings: dict) -> dict:
    """The app's Train fields (and what Train applies beside them) as this run trained its bridge, its precision
    left to the processor that reproduces it (calm_core.lab.session.NATIVE_BF16)."""
    return {"steps": settings["compose_steps"], "lr": settings["compose_lr"], "batch_size": settings["compose_batch"],
            "gate_lr_scale": settings["gate_lr_scale"], "augment_noise": settings["augment_noise"],
            "position_lr_scale": settings["position_lr_scale"], "value_lr_scale": settings["value_lr_scale"],
            "bf16": "native"}  # the app: bf16 where the processor has it natively (this run's own: compose_bf16)


def write_preset_json(out: Path, result: dict, s, data: dict) -> None:
    row = result["table"]["exact match %, held-out entities"]
    cells = ", ".join(f"{k} {v:.1f}" for k, v in row.items())
    g = with_expected(result["general"])
    forms = W.QUESTIONS[s.attributes[0]]
    sentence = getattr(s, "answer_style", "town") == "sentence"
    own_words = " or in your own words" if sentence else ""
    scored = "Answers naming the right town (it answers 'NAME was born in TOWN.')" if sentence else "Exact match on the town"
    meta = {
        "name": "real_knowledge",
        "title": "A made-up world that only m_A knows, used by a frozen real chat model (SmolLM2 + Gemma 3)",
        "description": (
            f"m_A = Gemma 3 270M + a LoRA adapter trained only on encyclopedia sentences about {s.entities} invented "
            f"people and their home towns ({s.towns} invented towns). The anchor = SmolLM2-135M-Instruct, frozen, never "
            f"shown the world. The bridge was trained on questions about {len(data['parts']['compose'])} people (20%) "
            f"and on general questions answered by the anchor itself; ask about the others in one of the trained "
            f"forms ({'; '.join(f.format(x='NAME') for f in forms)}){own_words}: world.json lists every person, their "
            f"town and split. {scored}, held-out people: {cells}. General prompts: perplexity "
            f"{g['perplexity_on']:.2f} with the bridge, {g['perplexity_off']:.2f} without; "
            f"{g['expected_on']} of {g['prompts']} greedy answers hold an expected word ('Paris' for the capital of "
            f"France...) with it, {g['expected_off']} without."
            + report.fresh_sentence(result.get("settings"))),
        "example_prompts": [r["question"] for r in data["test"][:4]],
        "question_forms": {a: W.QUESTIONS[a] for a in s.attributes},
        "prompt_mode": "chat",
        "anchor_model": "real_pair:smollm2",
        "augment_model": "real_pair:gemma",
        "augment_adapter": "adapter",
        "bridge": "bridge",
        "calm_config": s.calm_config().to_dict(),
        "max_new_tokens": max(s.max_new_tokens, SENTENCE_TOKENS) if sentence else s.max_new_tokens,
        "eval_max_new_tokens": max(s.max_new_tokens, SENTENCE_TOKENS) if sentence else s.max_new_tokens,
        "metrics": ["exact_match", "loss"],
        "eval_files": {"held-out people": "data/eval_heldout.jsonl", "general prompts": "data/eval_general.jsonl"},
        "eval_table_rows": {"held-out people": {"exact_match": "exact match %, held-out entities"}},
        "train_file": "data/composition_train.jsonl",
        "validation_file": "data/composition_validation.jsonl",
        "table": result["table"],
        "times_s": result["times_s"],
        "settings": result["settings"],
        "train": train_settings(result["settings"]),
        # calm_core.training.recipes: the value-path start, learning rates and rehearsal (+ attention started on m_A's
        # newest token for sentence answers, as bridge_training.py starts it)
        "recipe": "knowledge-sentence" if sentence and s.recency_init else "knowledge",
    }
    (out / "preset.json").write_text(json.dumps(meta, indent=1))


def ship(run: Path, preset: Path, check: int = 100) -> dict:
    """Copy a run into the app's preset folder with m_A's adapter and the bridge in bf16 (half the megabytes),
    then ask the shipped composition `check` held-out questions and record its exact match beside the run's."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    run, preset = Path(run), Path(preset)
    if preset.exists():
        shutil.rmtree(preset)
    preset.mkdir(parents=True)
    for name in ("preset.json", "world.json", "table.json", "table.md", "generalisation.json", "generalisation.md"):
        if (run / name).is_file() or not name.startswith("generalisation"):
            shutil.copy2(run / name, preset / name)
    shutil.copytree(run / "data", preset / "data")
    for sub, weights in (("adapter", "adapter_model.safetensors"), ("bridge", "bridge.safetensors")):
        shutil.copytree(run / sub, preset / sub, ignore=shutil.ignore_patterns("*.safetensors", "README.md"))
        tensors = load_file(str(run / sub / weights))
        save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()},
                  str(preset / sub / weights), metadata={"format": "pt"})
    from calm_core.lab.presets import load_preset
    from calm_core.lab.session import LabSession, ModelCache

    from .scoring import exact

    if preset.parent.resolve() != _presets_dir():
        raise SystemExit(f"{preset} is not under the app's presets folder {_presets_dir()}")
    session = LabSession(ModelCache())
    session.use_preset(preset.name)
    rows = [json.loads(x) for x in (preset / "data" / "eval_heldout.jsonl").read_text().splitlines()][:check]
    meta = json.loads((preset / "preset.json").read_text())
    score, _ = exact(session.calm, rows, scoring_settings(meta))
    if (preset / "generalisation.json").is_file():  # generalisation.py's probe of this run: what to try, honestly
        meta["description"] += " " + what_to_try(json.loads((preset / "generalisation.json").read_text()))
        people = json.loads((preset / "world.json").read_text())["people"]
        person = next(p["name"] for p in reversed(people) if p["split"] == "test")
        # beside the trained forms: a wording it never trained on, and a question the bridge should leave alone
        meta["example_prompts"] = meta["example_prompts"][:3] + [f"Where was {person} born?",
                                                                 "What is the capital of France?"]
    meta["shipped_check"] = {"held_out_questions": len(rows), "exact_match": score,
                             "note": "the shipped files (adapter and bridge in bf16), loaded as the app loads them"}
    (preset / "preset.json").write_text(json.dumps(meta, indent=1))
    load_preset(preset.name)  # it loads
    return meta["shipped_check"]


def scoring_settings(meta: dict):
    """Settings to score a preset's answers with: its run's answer style, and its eval_max_new_tokens."""
    from dataclasses import fields

    from .settings import Settings

    known = {f.name for f in fields(Settings)}
    s = Settings(**{k: v for k, v in (meta.get("settings") or {}).items() if k in known})
    s.max_new_tokens = meta.get("eval_max_new_tokens", s.max_new_tokens)
    return s


def what_to_try(g: dict) -> str:
    """The preset description's guide for a student, from generalisation.py's result on the test people: question
    forms the bridge never trained on, invented names and general questions, with the measured numbers."""
    never = {n: r for n, r in g["held_out"].items() if n != "trained forms"}
    mean = sum(r["named_on"] for r in never.values()) / len(never)
    worst = min(never, key=lambda n: never[n]["named_on"])
    inv, fam, gen = g["unknown"]["invented"], g["unknown"]["famous"], g["general"]
    return (f"Try your own wording too: in {len(never)} question forms it never trained on (\"Where was NAME born?\", "
            f"lower case, a typo, a second chat turn...) {mean:.0f}% of answers name the right town (weakest: "
            f"{worst}, {never[worst]['named_on']:.0f}%). " + unknown_sentence(inv) + " About a famous person "
            f"(\"Where was Albert Einstein born?\") the expected town or country comes in {fam['expected_on']}/{fam['asked']} answers "
            f"with the bridge, {fam['expected_off']}/{fam['asked']} without. A general question (\"What is the capital of France?\") is where the bridge should stay out of "
            f"the way: perplexity {gen['ratio']:.2f}x the anchor's, expected words {gen['expected_on']}/{gen['prompts']} "
            f"with the bridge, {gen['expected_off']}/{gen['prompts']} without (generalisation.md).")


def unknown_sentence(inv: dict) -> str:
    """What a student sees when asking about a name that is in no list, as measured (at most 2%: the issue's goal)."""
    rate = f"{inv['invented_on']:.0f}% of such answers name one of the world's towns (the anchor alone {inv['invented_off']:.0f}%)"
    if inv["invented_on"] <= 2.0:
        return (f"Ask about a name that is in no list (an invented one): m_A was also taught names it never read about "
                f"as unknown, so the composition says the town is unknown instead of inventing one ({rate}).")
    return (f"Ask about a name that is in no list (an invented one): it should say the town is unknown, and NOT yet "
            f"always does: {rate}; the goal is at most 2%.")


def _presets_dir() -> Path:
    from calm_core.lab.presets import PRESETS_DIR

    return Path(PRESETS_DIR).resolve()


def mark_development(run: Path, text: str) -> None:
    """Say in the run's table and preset description that its world was already used for choices (a second look,
    not a fresh world), in the words given; the table is relabelled, the description keeps the run's own part."""
    run = Path(run)
    table = json.loads((run / "table.json").read_text())
    table["development"] = text
    (run / "table.json").write_text(json.dumps(table, indent=1))
    report.relabel(run)
    meta = json.loads((run / "preset.json").read_text())
    meta["description"] = report.own_description(meta["description"]).rstrip() + " " + text
    (run / "preset.json").write_text(json.dumps(meta, indent=1))


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m demos.real_knowledge.preset_files", description=(
        "Ship a run folder as the app's real_knowledge preset: adapter and bridge in bf16, then the shipped files "
        "asked held-out questions as the app loads them."))
    ap.add_argument("run", type=Path, help="the run folder (python -m demos.real_knowledge --out RUN)")
    ap.add_argument("preset", type=Path, help="the preset folder to (over)write, under presets/")
    ap.add_argument("--check", type=int, default=100, help="held-out questions the shipped files are asked")
    ap.add_argument("--development", metavar="TEXT", default="",
                    help="the run's world was used for choices: this sentence says how (table and description)")
    args = ap.parse_args(argv)
    if args.development:
        mark_development(args.run, args.development)
    print(ship(args.run, args.preset, args.check))


if __name__ == "__main__":
    main()
