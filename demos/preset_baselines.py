"""The paper's comparison on a shipped preset, through the lab's own calls (what the app's Train and Evaluate tabs
run): the preset's composition against baselines that train the anchor itself on the same composition data, with as
many trainable parameters as the bridge (LoRA; its top layers), on the preset's held-out sets and the forgetting set.

    python -m demos.preset_baselines kv_arithmetic --methods lora finetune
    python -m demos.preset_baselines real_knowledge --methods lora

Each baseline trains with the preset's recorded `train` settings (steps, batch, learning rate: those of its bridge).
Writes results/<preset>/baselines/{table.json,table.md} and copies the table to presets/<preset>/baselines.md,
which the preset's story and the Evaluate tab show."""
from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

from calm_core.lab import LabSession
from calm_core.lab.comparison import FORGETTING, FORGETTING_COLUMNS
from demos.run_folder import start_run

ROOT = Path(__file__).resolve().parents[1]


def train_baselines(lab: LabSession, methods, steps: int | None) -> dict:
    """method -> {"seconds", "trainable", "steps"}: each baseline trained in turn on the preset's training file."""
    lab.set_data(lab.preset.train_file, validation_path=lab.preset.validation_file)
    done = {}
    for method in methods:
        config = replace(lab.train_config(), method=method, **({"steps": steps} if steps else {}))
        started = time.perf_counter()
        lab.start_training(config)
        lab.wait()
        if method not in lab.baselines:
            raise SystemExit(f"The {method} baseline did not finish: {lab.run.message}")
        done[method] = {"seconds": round(time.perf_counter() - started, 1), "steps": config.steps,
                        "batch_size": config.batch_size, "lr": config.lr,
                        "trainable": lab.baselines[method].num_parameters()[0]}
        print(f"{method}: {done[method]}", flush=True)
    return done


def score(lab: LabSession, limit: int | None) -> dict:
    """{set: [rows]} on each of the preset's evaluation sets (scored as its table was), forgetting on the first."""
    preset, tables = lab.preset, {}
    tokens = preset.eval_max_new_tokens or preset.max_new_tokens
    for i, (label, path) in enumerate(preset.eval_files.items()):
        metrics = ["exact_match"] + ([FORGETTING] if i == 0 else [])
        table = lab.evaluate(path, metrics, tokens, limit, scoring=preset.scoring(label))
        tables[label] = [{**{k: v for k, v in row.items() if k in ("exact_match", *FORGETTING_COLUMNS)},
                          "model": short(row["model"])} for row in table.rows]
        print(label, tables[label], flush=True)
    return tables


def short(model: str) -> str:
    """"anchor: /path/to/anchor" -> "anchor alone"; a baseline's name without its parameter counts."""
    role = model.split(" (")[0].split(":")[0]
    return {"anchor": "anchor alone", "augment 0": "augmenting alone"}.get(role, role)


def markdown(preset, trained: dict, tables: dict, bridge: int, command: str) -> str:
    models = [r["model"] for r in next(iter(tables.values()))]
    lines = [f"### Baselines on the same data: {preset.title}", "",
             "Exact match % on the preset's evaluation sets (scored as its table is). The baselines train the anchor "
             "itself on the composition's training file, with the bridge's steps, batch and learning rate and about "
             f"its trainable parameter count ({bridge:,}).", "",
             "| set | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for label, rows in tables.items():
        lines.append(f"| {label} | " + " | ".join(f"{r['exact_match']:.1f}" for r in rows) + " |")
    first = next(iter(tables.values()))
    anchor_knows_none = str(first[0].get(FORGETTING_COLUMNS[1], "0/")).startswith("0/")
    for column in FORGETTING_COLUMNS if not anchor_knows_none else ():
        cells = [r.get(column) for r in first]
        lines.append(f"| {column} | " + " | ".join("–" if c is None else f"{c:.3f}" if isinstance(c, float) else str(c)
                                                    for c in cells) + " |")
    lines += ["", "| baseline | trainable parameters (bridge: %s) | steps × batch | lr | time on 2 CPU cores |" % f"{bridge:,}",
              "|---|---|---|---|---|"]
    lines += [f"| {m} | {t['trainable']:,} | {t['steps']} × {t['batch_size']} | {t['lr']:g} | {t['seconds'] / 60:.1f} min |"
              for m, t in trained.items()]
    if anchor_knows_none:
        lines += ["", "The forgetting set (general English questions) is left out: the anchor alone answers none of "
                  "them, so it cannot show what training took away; the rows the anchor alone answers are that check "
                  "here."]
    lines += ["", "Forgetting: 16 general questions the anchor answered before; perplexity of their written answers "
              "against the anchor alone's (1 = unchanged; the augmenting model has no row: it is not the anchor), and "
              "answers holding the expected word. Rerun: `" + command + "`."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset")
    parser.add_argument("--methods", nargs="+", default=["lora", "finetune"], choices=["lora", "finetune"])
    parser.add_argument("--steps", type=int, help="fewer steps than the preset's (a smoke run: nothing is copied)")
    parser.add_argument("--limit", type=int, help="examples per evaluation set (default: all)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    out, _ = start_run(args.out or ROOT / "results" / args.preset / "baselines", args.threads)
    lab = LabSession()
    preset = lab.use_preset(args.preset)
    trained = train_baselines(lab, args.methods, args.steps)
    tables = score(lab, args.limit)
    bridge = lab.require().num_parameters()[0]
    command = f"python -m demos.preset_baselines {args.preset} --methods {' '.join(args.methods)}"
    (out / "table.json").write_text(json.dumps({"preset": args.preset, "bridge_parameters": bridge,
                                                "baselines": trained, "tables": tables, "command": command}, indent=1))
    (out / "table.md").write_text(markdown(preset, trained, tables, bridge, command))
    if not (args.steps or args.limit or args.out):  # the full run: the preset carries its rows
        shutil.copy(out / "table.md", preset.root / "baselines.md")
    print((out / "table.md").read_text())


if __name__ == "__main__":
    main()
