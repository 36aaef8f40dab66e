"""The whole key-value arithmetic demo: data -> base models -> composition -> controls -> table -> preset.

    python -m demos.kv_arithmetic                  # full pipeline, writes presets/kv_arithmetic/
    python -m demos.kv_arithmetic --smoke --out /tmp/kv_smoke
"""
from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict
from pathlib import Path

from demos.run_folder import start_run

from . import data as D
from .base import add_settings_arguments, apply_arguments, build_model, load_model, log, train_lm
from .base_models import train_base, trained_with
from .settings import Settings, for_run

# ---- 1. data ---------------------------------------------------------------------------------

def make_data(s: Settings, out: Path) -> dict:
    """D_KV, the composition files (train keys only) and the evaluation files; returns the splits."""
    kv = D.make_kv(s.keys, seed=s.seed, train_share=s.train_share)
    rng = random.Random(s.seed + 7)
    # expressions over the training keys: evaluation rows first, so that a small key space
    # (40 keys, 2 operands: 3200 expressions) shortens the composition set, not the evaluation
    n_val = max(1, s.compose_examples // 10)
    train_exprs = D.expressions(kv.values, kv.train_keys, s.eval_examples + n_val + s.compose_examples,
                                s.operands, seed=s.seed + 1)
    train_eval, val, comp = (train_exprs[:s.eval_examples], train_exprs[s.eval_examples:s.eval_examples + n_val],
                             train_exprs[s.eval_examples + n_val:])
    fmt = lambda exprs, name: [D.formats(kv.values, k, o, s.kv_subs_end)[name] for k, o in exprs]
    n_num = round(len(comp) * s.num_math_share / (1 - s.num_math_share))
    # KV-MATH in the anchor's own answer format, or the paper's D_C: KV-SUBS, no arithmetic
    answers = "kv_subs" if s.composition == "kv_subs" else "kv_math_shown" if s.anchor_restate else "kv_math"
    composition = fmt(comp, answers) + [D.num_math_random(rng, s.keys, s.operands) for _ in range(n_num)]
    rng.shuffle(composition)
    held = D.expressions(kv.values, kv.heldout_keys, s.eval_examples, s.operands, seed=s.seed + 2)
    files = {
        "composition_train": composition,
        "composition_validation": fmt(val, answers),
        "eval_kv_subs": fmt(held, "kv_subs"),
        "eval_num_math": fmt(held, "num_math"),
        "eval_kv_math_heldout": fmt(held, "kv_math"),
        "eval_kv_math_trainkeys": fmt(train_eval, "kv_math"),
        "kv_lookups": D.kv_lookups(kv.values, list(kv.values)),
    }
    if s.anchor_restate:  # for the app's exact match: the values and the result, as the anchor answers
        files["eval_kv_math_heldout_shown"] = fmt(held, "kv_math_shown")
        files["eval_kv_math_trainkeys_shown"] = fmt(train_eval, "kv_math_shown")
    paths = {name: str(D.write_jsonl(out / "data" / f"{name}.jsonl", rows)) for name, rows in files.items()}
    (out / "data" / "kv.json").write_text(json.dumps(kv.to_dict()))
    return {"kv": kv, "files": files, "paths": paths}


# ---- 3. composition (the bridge; calm_core's Trainer) ----------------------------------------

def bridge_config(s):
    """The bridge's CALMConfig: explicit layer lists (ours: the embeddings <- m_A's last layer), or with
    compose_every the paper's layout of blocks after every few layers of both models."""
    from calm_core import CALMConfig

    every = getattr(s, "compose_every", 0)  # the translation demo's settings (it shares compose) have none
    layers = (dict(every=every) if every else
              dict(anchor_layers=list(s.compose_anchor_layers), augment_layers=list(s.compose_augment_layers)))
    return CALMConfig(**layers, gate=s.gate, insert=s.compose_insert, recency=s.compose_recency,
                      null_slot=s.compose_null_slot, window=s.compose_window,
                      relative=getattr(s, "compose_relative", False))


def compose(s, anchor, augment, tokenizer, files: dict, out_dir: Path | None, label: str = "CALM", prepare=None):
    """Train a bridge between the frozen anchor and augmenting models on the composition data.
    prepare(calm) -> dict, if given, runs on the new composition before training (e.g. an initialisation)."""
    from calm_core import ComposedLM
    from calm_core.training.data import Example
    from calm_core.training.trainer import TrainConfig, Trainer

    calm = ComposedLM(anchor=(anchor, tokenizer), augments=[(augment, tokenizer)], config=bridge_config(s))
    prepared = prepare(calm) if prepare else None
    train = [Example(p, c) for p, c in files["composition_train"]]
    val = [Example(p, c) for p, c in files["composition_validation"]]
    config = TrainConfig(steps=s.compose_steps, lr=s.compose_lr, batch_size=s.compose_batch, augment_noise=s.compose_noise,
                         warmup_steps=min(20, max(1, s.compose_steps // 10)), eval_every=max(1, s.compose_steps // 4),
                         log_every=max(1, s.compose_steps // 12), seed=s.seed, progress=False,
                         gate_lr_scale=getattr(s, "gate_lr_scale", 1.0),
                         position_lr_scale=getattr(s, "position_lr_scale", 1.0),
                         value_lr_scale=getattr(s, "value_lr_scale", 1.0))
    log(f"{label}: training the bridge ({calm.num_parameters()[0]:,d} parameters), {s.compose_steps} steps")
    t = time.perf_counter()
    result = Trainer(calm, train, val, config,
                     callback=lambda r: log(f"  {label} step {r['step']} loss={r['loss']:.4f} val={r['val_loss']} "
                                            f"gates={[round(g, 3) for g in r['gates']]}")).train()
    seconds = time.perf_counter() - t
    if out_dir is not None:
        calm.save_pretrained(out_dir)
    return calm, {"seconds": seconds, "history": result.history, "stop_reason": result.stop_reason,
                  "prepared": prepared}


# ---- 4. control: the anchor fine-tuned directly on the same composition data -----------------

def finetune_anchor(s, anchor_dir: Path, files: dict, data_name: str = "the composition data"):
    """Full fine-tuning of a copy of m_B on the composition data (train keys only): it can learn
    the training keys' values, never the held-out ones."""
    model, tok = load_model(anchor_dir)
    rows = files["composition_train"]

    def sampler(rng):
        prompt, completion = rng.choice(rows)
        return [(prompt, False), (completion, True)]

    log(f"control: fine-tuning m_B on {data_name}, {s.finetune_steps} steps")
    t = time.perf_counter()
    train_lm(model, tok, sampler, s.finetune_steps, s.compose_batch, s.finetune_lr, warmup=20, seed=s.seed + 31,
             log_every=max(1, s.finetune_steps // 6), log=log)
    return model, time.perf_counter() - t


def compose_with_controls(s, base: dict, files: dict, out: Path, random_augment, tuned_column: str,
                          data_name: str = "the composition data") -> tuple[dict, dict, dict]:
    """The bridge, and (when `random_augment` builds an untrained m_A) the two trained controls: m_B fine-tuned
    on the same data, and the same bridge on a random m_A. Returns the table's columns, the bridge's training
    record and the times so far. Shared by the key-value and translation demos."""
    A, B, tok = base["augment"], base["anchor"], base["tokenizer"]
    calm, comp = compose(s, B, A, tok, files, out / "bridge")
    columns = {"m_A": (A, tok), "m_B": (B, tok), "CALM": (calm, None)}
    times = {**base["times"], "compose_s": comp["seconds"]}
    if random_augment is not None:
        tuned, times["finetune_s"] = finetune_anchor(s, out / "anchor", files, data_name)
        calm_random, rand = compose(s, B, random_augment().eval(), tok, files, None, label="CALM with random m_A")
        times["compose_random_s"] = rand["seconds"]
        columns[tuned_column] = (tuned, tok)
        columns["CALM with random m_A"] = (calm_random, None)
    return columns, comp, times


# ---- 5. evaluation ---------------------------------------------------------------------------

ROW_FILES = {"KV-SUBS": "eval_kv_subs", "NUM-MATH": "eval_num_math",
             "KV-MATH (held-out keys)": "eval_kv_math_heldout", "KV-MATH (train keys)": "eval_kv_math_trainkeys"}
# An anchor that restates its operands answers "ab+cd=" with "95+22=117": its first part is scored as the
# substitution (KV-SUBS), the text after its last "=" as the result (NUM-MATH, KV-MATH); a plain answer is
# both. Answers the paper's way ("117", "95+22") score exactly as before.
ROW_SCORES = {"KV-SUBS": D.substitution, "NUM-MATH": D.final_result,
              "KV-MATH (held-out keys)": D.final_result, "KV-MATH (train keys)": D.final_result}


def row_scores(s: Settings) -> dict:
    """row -> the part of an answer that is scored: ROW_SCORES, or with s.whole_answers the whole answer
    (the paper: KV-MATH answered with the number alone, so "95+22=117" is wrong)."""
    return {row: D.whole for row in ROW_SCORES} if s.whole_answers else dict(ROW_SCORES)


def accuracy(target, tokenizer, rows, max_new_tokens: int, part=D.final_result) -> float:
    """% of rows whose greedy answer (calm_core.training.evaluation.predictions) has the reference's `part`."""
    from calm_core.training.data import Example
    from calm_core.training.evaluation import as_composed, predictions

    examples = [Example(p, c) for p, c in rows]
    answers = predictions(as_composed(target, tokenizer), examples, max_new_tokens=max_new_tokens)
    return 100.0 * sum(part(a) == part(c) for a, (_, c) in zip(answers, rows)) / max(1, len(rows))


def answer_tokens(operands: int) -> int:
    """New tokens an answer may take: room for a restated expression and its result."""
    return 12 * operands + 6


def evaluate_all(columns: dict, files: dict, operands: int, n: int, scores: dict = ROW_SCORES) -> dict:
    """columns: name -> (model or ComposedLM, tokenizer or None); scores: row -> part scored. Returns row -> column -> %."""
    max_new = answer_tokens(operands)
    table = {row: {} for row in ROW_FILES}
    for col, (target, tok) in columns.items():
        t = time.perf_counter()
        for row, name in ROW_FILES.items():
            table[row][col] = accuracy(target, tok, files[name][:n], max_new, scores[row])
        log(f"evaluated {col} in {time.perf_counter() - t:.0f}s: " + ", ".join(f"{r} {table[r][col]:.1f}" for r in ROW_FILES))
    return table


# ---- 6. the whole pipeline and the preset ----------------------------------------------------

EXAMPLE_PROMPTS = 4


def run(s: Settings, out: Path, controls: bool = True, until: str | None = None) -> dict:
    out, t0 = start_run(out, s.threads)
    log(f"data: {s.keys} keys, {s.operands} operands, composition over {s.train_share:.0%} of the keys -> {out / 'data'}")
    splits = make_data(s, out)
    kv, files = splits["kv"], splits["files"]
    base = train_base(s, kv, files, out)
    tok = base["tokenizer"]
    if until == "base":
        return {"base": base}
    random_augment = (lambda: build_model(tok, s.augment_layers, s.width, seed=s.seed + 99, digit_embeddings=False)) \
        if controls else None
    columns, comp, times = compose_with_controls(s, base, files, out, random_augment, "m_B fine-tuned (20% keys)")
    t = time.perf_counter()
    table = {row: {col: round(v, 1) for col, v in cols.items()}
             for row, cols in evaluate_all(columns, files, s.operands, s.eval_examples, row_scores(s)).items()}
    times["evaluate_s"] = time.perf_counter() - t
    times["total_s"] = time.perf_counter() - t0
    from .report import PAPER_TABLE, markdown, protocol, save

    print("\n" + markdown(table, settings=asdict(s)) + "\n", flush=True)
    meta = {"settings": asdict(s), "times_s": {k: round(v, 1) for k, v in times.items()},
            "eval_examples": s.eval_examples, "compose_history": comp["history"], "base_copied": base["copied"],
            # steps each base model took (m_B trains on below anchor_min_num_math) and m_B's probe at the end
            "base_trained": {n: (trained_with(out, n) or {}).get("trained") for n in ("augment", "anchor")}}
    save(table, out, meta)
    held = files["eval_kv_math_heldout"]
    trained_on = "substitution (KV-SUBS, no arithmetic)" if s.composition == "kv_subs" else "arithmetic"
    scored = ("scored on the whole answer (the number alone)" if s.whole_answers else
              "scored on the result after the values the anchor restates" if s.anchor_restate else "scored on the result")
    paper_note = ("The paper's protocol on models from scratch at a far smaller scale than the paper's 84.3%"
                  if s.protocol == "paper" else "The paper's 84.3% is for another protocol (composition on KV-SUBS, "
                  "KV-MATH answered with the number alone)")
    preset = {
        "name": "kv_arithmetic",
        "title": "Key-value arithmetic (CALM paper, section 4.1)",
        "description": (
            f"m_A (augmenting, {s.augment_layers}x{s.width}) memorised {s.keys} string keys -> integer values and never saw "
            f"arithmetic; m_B (anchor, {s.anchor_layers}x{s.width}) does +/- arithmetic and never saw a key. The bridge "
            f"was trained on {trained_on} over {s.train_share:.0%} of the keys only; try expressions over the other keys. "
            f"Measured on held-out keys: CALM {table['KV-MATH (held-out keys)']['CALM']:.1f}% exact "
            f"(m_A {table['KV-MATH (held-out keys)']['m_A']:.1f}%, m_B {table['KV-MATH (held-out keys)']['m_B']:.1f}%), "
            f"{scored}. {paper_note}: see table.md."),
        "example_prompts": [p for p, _ in held[:EXAMPLE_PROMPTS]],
        "table": table,
        "paper_table": PAPER_TABLE,
        "paper_table_title": "The paper's Table 1 beside ours (accuracy %): not the same protocol, see protocol",
        "protocol": protocol(asdict(s)),
        # the app scores by exact match: a row's file in the anchor's answer format where make_data wrote one
        "eval_files": {row: f"data/{name + '_shown' if name + '_shown' in files else name}.jsonl"
                       for row, name in ROW_FILES.items()},
        # how the Evaluate tab measures each set, as the table was measured
        "metrics": ["exact_match"],
        "eval_max_new_tokens": answer_tokens(s.operands),
        "eval_scoring": ({row: "exact" for row in ROW_FILES} if s.whole_answers else
                         {"KV-SUBS": "substitution", "NUM-MATH": "result", "KV-MATH (held-out keys)": "result",
                          "KV-MATH (train keys)": "result"}),
        "train_file": "data/composition_train.jsonl",
        "validation_file": "data/composition_validation.jsonl",
        "anchor": "anchor", "augment": "augment", "bridge": "bridge",
        "settings": asdict(s),
        "times_s": meta["times_s"],
        # how the bridge was trained: the Train tab (and a baseline on the same data) starts from these
        "train": {"steps": s.compose_steps, "lr": s.compose_lr, "batch_size": s.compose_batch,
                  "augment_noise": s.compose_noise},
    }
    (out / "preset.json").write_text(json.dumps(preset, indent=2))
    log(f"done in {times['total_s']:.0f}s -> {out}")
    return {"table": table, "times": times, "preset": preset}


def main(argv=None) -> None:
    args, s = parse(argv)
    run(s, Path(args.out), controls=not args.no_controls, until=args.until)


def parse(argv=None) -> tuple[argparse.Namespace, Settings]:
    """The command line: --smoke / --protocol / --ablation pick the settings (settings.for_run), then every
    Settings field given as a flag replaces its value. A smoke run, another protocol, an ablation or another
    seed writes to runs/kv_<what it is>, never over presets/kv_arithmetic, unless --out says so."""
    p = argparse.ArgumentParser(prog="python -m demos.kv_arithmetic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="output folder (default: the app's preset, presets/kv_arithmetic; "
                                 "runs/kv_<smoke, protocol, ablation, seed> for any other run)")
    p.add_argument("--smoke", action="store_true", help="a tiny run (< 1 minute) that exercises every stage")
    p.add_argument("--until", choices=["base"], help="stop after training the base models")
    p.add_argument("--no-controls", action="store_true", help="skip the fine-tuned anchor and random m_A controls")
    add_settings_arguments(p, Settings)
    args = p.parse_args(argv)
    s = apply_arguments(for_run(args.smoke, args.protocol or "ours", args.ablation or ""), args)
    if args.out is None:
        named = [n for n in ("smoke" * args.smoke, s.protocol * (s.protocol != "ours"), s.ablation,
                             f"seed{s.seed}" * (s.seed != 0)) if n]
        args.out = "runs/kv_" + "_".join(named).replace("-", "_") if named else "presets/kv_arithmetic"
    return args, s
