"""The whole key-value arithmetic demo: data -> base models -> composition -> controls -> table -> preset.

    python -m demos.kv_arithmetic                  # full pipeline, writes presets/kv_arithmetic/
    python -m demos.kv_arithmetic --smoke --out /tmp/kv_smoke
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import data as D
from .base import (add_settings_arguments, apply_arguments, build_model, exact_match_bare, load_model, log,
                   make_tokenizer, save_model, train_lm)
from .recipes import anchor_sampler, augment_sampler


@dataclass
class Settings:
    keys: int = 500
    operands: int = 2
    seed: int = 0
    train_share: float = 0.2
    # base models (from scratch), trained side by side in two processes of threads/2 threads each
    augment_layers: int = 4
    anchor_layers: int = 4
    width: int = 128
    augment_steps: int = 1500
    anchor_steps: int = 1500
    augment_batch: int = 128
    anchor_batch: int = 256
    base_lr: float = 3e-3
    augment_value_layers: list[int] = field(default_factory=lambda: [2, 3])  # where m_A's value heads read
    augment_at_last_letter: bool = True  # m_A's value heads also read at each key's last letter
    augment_value_regression: bool = True  # m_A's value heads fit one-hot digit codes by squared error
    anchor_value_layers: list[int] = field(default_factory=list)  # where m_B's value heads read
    anchor_labels: float = 0.2  # share of m_B's operands preceded by a random word (never a key)
    anchor_merged: float = 0.3  # share of m_B's operands given as a random word carrying the value (base.MERGED)
    anchor_operand_noise: float = 0.3  # Gaussian noise on m_B's operand embeddings, relative to their size
    anchor_restate: bool = True  # m_B answers expressions with word operands as "95+22=117" (recipes.anchor_sampler)
    # share of those given "95+22=" with other values in the words: m_B computes from what it wrote (finding 16)
    anchor_given: float = 0.5
    parallel_base: bool = True
    # composition (the bridge)
    # into the anchor's token embeddings (layer 0, "before"), where m_B reads a word's value, from m_A's
    # last layer, each token reading only the m_A state aligned with it (README, finding 14)
    compose_anchor_layers: list[int] = field(default_factory=lambda: [0])
    compose_augment_layers: list[int] = field(default_factory=lambda: [3])
    gate: str = "channel"
    compose_insert: str = "before"
    compose_recency: int = 0  # learned attention biases for the newest m_A states (CALMConfig.recency)
    compose_null_slot: bool = True  # a null key the bridge may attend to, to write nothing (CALMConfig.null_slot)
    compose_window: int = 1  # how many of the newest m_A states each anchor token sees (CALMConfig.window)
    compose_steps: int = 3000
    compose_batch: int = 32
    compose_lr: float = 5e-3
    compose_noise: float = 0.5  # Gaussian noise on m_A states while the bridge trains (TrainConfig.augment_noise)
    compose_examples: int = 3000  # KV-MATH expressions over the training keys
    num_math_share: float = 0.2  # NUM-MATH mixed into the composition data (keeps m_B's arithmetic)
    # control: the anchor fine-tuned directly on the composition data
    finetune_steps: int = 600
    finetune_lr: float = 1e-3
    # evaluation
    eval_examples: int = 300
    threads: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))
    reuse_base: bool = False

    @classmethod
    def smoke(cls) -> "Settings":
        """Every stage and option at a tiny scale."""
        return cls(keys=30, augment_layers=2, anchor_layers=2, width=32, augment_steps=20, anchor_steps=20,
                   augment_batch=16, anchor_batch=16, augment_value_layers=[1], augment_value_regression=True,
                   anchor_value_layers=[1], compose_anchor_layers=[1], compose_augment_layers=[1], compose_recency=2,
                   compose_steps=10, compose_batch=8, compose_examples=60, finetune_steps=10, eval_examples=12)


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
    fmt = lambda exprs, name: [D.formats(kv.values, k, o)[name] for k, o in exprs]
    n_num = round(len(comp) * s.num_math_share / (1 - s.num_math_share))
    answers = "kv_math_shown" if s.anchor_restate else "kv_math"  # in the anchor's own answer format
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


# ---- 2. base models --------------------------------------------------------------------------

BASE_TITLES = {"augment": "m_A (augmenting: knows D_KV, no arithmetic)",
               "anchor": "m_B (anchor: arithmetic, never a key of D_KV)"}


def train_one_base(name: str, s: Settings, kv: D.KVSpace, files: dict, out: Path, threads: int) -> float:
    """Train m_A ("augment") or m_B ("anchor") from scratch and save it to out/name; returns seconds."""
    torch.set_num_threads(threads)
    tok = make_tokenizer(s.keys)
    if name == "augment":
        layers, steps, batch, seed, warmup = s.augment_layers, s.augment_steps, s.augment_batch, s.seed, 50
        sampler = augment_sampler(kv.values, s.operands, at_last_letter=s.augment_at_last_letter)
        value_layers, noise = s.augment_value_layers, 0.0
        rows, metric = files["eval_kv_subs"][:200], "kv_subs"
    else:
        layers, steps, batch, seed, warmup = s.anchor_layers, s.anchor_steps, s.anchor_batch, s.seed + 1, 100
        sampler = anchor_sampler(s.keys, s.operands, forbidden=set(kv.values), labels=s.anchor_labels,
                                 merged=s.anchor_merged, restate=s.anchor_restate,
                                 given=s.anchor_given)
        value_layers, noise = s.anchor_value_layers, s.anchor_operand_noise
        rows, metric = files["eval_num_math"][:200], "num_math"
    prefix = "m_A" if name == "augment" else "m_B"
    log(f"training {BASE_TITLES[name]}: {layers}x{s.width}, {steps} steps of {batch}, value heads on layers {value_layers}")
    t = time.perf_counter()
    model = build_model(tok, layers, s.width, seed=seed)

    def check():  # and keep what was learned so far
        save_model(model, tok, out / name)
        return {metric: exact_match_bare(model, tok, rows)}

    train_lm(model, tok, sampler, steps, batch, s.base_lr, warmup=warmup, seed=seed, log_every=max(1, steps // 20),
             eval_every=max(1, steps // 20) * 4, evaluate=check, log=lambda m: log(f"{prefix}{m}"),
             value_layers=value_layers, value_regression=name == "augment" and s.augment_value_regression,
             operand_noise=noise, every_step=more_threads_when_alone(out, name, threads, s.threads))
    seconds = time.perf_counter() - t
    save_model(model, tok, out / name)
    (out / f"{name}.done").touch()
    return seconds


def more_threads_when_alone(out: Path, name: str, threads: int, all_threads: int):
    """Side by side, each base model has half the threads; the one that finishes last takes them
    all once the other has saved its final model (checked every 20 steps)."""
    other = out / ("anchor.done" if name == "augment" else "augment.done")

    def check(step: int) -> None:
        if step % 20 == 0 and torch.get_num_threads() < all_threads and other.exists():
            torch.set_num_threads(all_threads)
            log(f"{name}: the other base model is done, now {all_threads} threads")
    return check


def train_base(s: Settings, kv: D.KVSpace, files: dict, out: Path) -> dict:
    """Train m_A and m_B from scratch, side by side in two processes with s.parallel_base (or reuse
    the ones in out/ with s.reuse_base)."""
    times_path = out / "base_times.json"
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    todo = [n for n in ("augment", "anchor") if not (s.reuse_base and (out / n / "config.json").exists())]
    for name in {"augment", "anchor"} - set(todo):
        log(f"reusing {BASE_TITLES[name]} from {out / name}")
    if todo:
        for name in ("augment", "anchor"):
            (out / f"{name}.done").unlink(missing_ok=True)
        t = time.perf_counter()
        if s.parallel_base and len(todo) > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(len(todo), mp_context=multiprocessing.get_context("spawn")) as pool:
                half = max(1, s.threads // 2)
                futures = {n: pool.submit(train_one_base, n, s, kv, files, out, half) for n in todo}
                times.update({f"{n}_s": f.result() for n, f in futures.items()})
        else:
            times.update({f"{n}_s": train_one_base(n, s, kv, files, out, s.threads) for n in todo})
        times["base_wall_s"] = time.perf_counter() - t
        for name in ("augment", "anchor"):
            (out / f"{name}.done").unlink(missing_ok=True)
        times_path.write_text(json.dumps(times))
    (augment, tok), (anchor, _) = load_model(out / "augment"), load_model(out / "anchor")
    return {"augment": augment, "anchor": anchor, "tokenizer": tok,
            "times": times}


# ---- 3. composition (the bridge; calm_core's Trainer) ----------------------------------------

def compose(s, anchor, augment, tokenizer, files: dict, out_dir: Path | None, label: str = "CALM"):
    """Train a bridge between the frozen anchor and augmenting models on the composition data."""
    from calm_core import CALMConfig, ComposedLM
    from calm_core.data import Example
    from calm_core.training import TrainConfig, Trainer

    calm = ComposedLM(anchor=(anchor, tokenizer), augments=[(augment, tokenizer)],
                      config=CALMConfig(anchor_layers=list(s.compose_anchor_layers),
                                        augment_layers=list(s.compose_augment_layers), gate=s.gate,
                                        insert=s.compose_insert, recency=s.compose_recency,
                                        null_slot=s.compose_null_slot, window=s.compose_window))
    train = [Example(p, c) for p, c in files["composition_train"]]
    val = [Example(p, c) for p, c in files["composition_validation"]]
    config = TrainConfig(steps=s.compose_steps, lr=s.compose_lr, batch_size=s.compose_batch, augment_noise=s.compose_noise,
                         warmup_steps=min(20, max(1, s.compose_steps // 10)), eval_every=max(1, s.compose_steps // 4),
                         log_every=max(1, s.compose_steps // 12), seed=s.seed, progress=False)
    log(f"{label}: training the bridge ({calm.num_parameters()[0]:,d} parameters), {s.compose_steps} steps")
    t = time.perf_counter()
    result = Trainer(calm, train, val, config,
                     callback=lambda r: log(f"  {label} step {r['step']} loss={r['loss']:.4f} val={r['val_loss']} "
                                            f"gates={[round(g, 3) for g in r['gates']]}")).train()
    seconds = time.perf_counter() - t
    if out_dir is not None:
        calm.save_pretrained(out_dir)
    return calm, {"seconds": seconds, "history": result.history, "stop_reason": result.stop_reason}


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


# ---- 5. evaluation ---------------------------------------------------------------------------

ROW_FILES = {"KV-SUBS": "eval_kv_subs", "NUM-MATH": "eval_num_math",
             "KV-MATH (held-out keys)": "eval_kv_math_heldout", "KV-MATH (train keys)": "eval_kv_math_trainkeys"}
# An anchor that restates its operands answers "ab+cd=" with "95+22=117": its first part is scored as the
# substitution (KV-SUBS), the text after its last "=" as the result (NUM-MATH, KV-MATH); a plain answer is
# both. Answers the paper's way ("117", "95+22") score exactly as before.
ROW_SCORES = {"KV-SUBS": D.substitution, "NUM-MATH": D.final_result,
              "KV-MATH (held-out keys)": D.final_result, "KV-MATH (train keys)": D.final_result}


def accuracy(target, tokenizer, rows, max_new_tokens: int, part=D.final_result) -> float:
    """% of rows whose greedy answer (calm_core.evaluation.predictions) has the reference's `part`."""
    from calm_core.data import Example
    from calm_core.evaluation import as_composed, predictions

    examples = [Example(p, c) for p, c in rows]
    answers = predictions(as_composed(target, tokenizer), examples, max_new_tokens=max_new_tokens)
    return 100.0 * sum(part(a) == part(c) for a, (_, c) in zip(answers, rows)) / max(1, len(rows))


def answer_tokens(operands: int) -> int:
    """New tokens an answer may take: room for a restated expression and its result."""
    return 12 * operands + 6


def evaluate_all(columns: dict, files: dict, operands: int, n: int) -> dict:
    """columns: name -> (model or ComposedLM, tokenizer or None). Returns row -> column -> %."""
    max_new = answer_tokens(operands)
    table = {row: {} for row in ROW_FILES}
    for col, (target, tok) in columns.items():
        t = time.perf_counter()
        for row, name in ROW_FILES.items():
            table[row][col] = accuracy(target, tok, files[name][:n], max_new, ROW_SCORES[row])
        log(f"evaluated {col} in {time.perf_counter() - t:.0f}s: " + ", ".join(f"{r} {table[r][col]:.1f}" for r in ROW_FILES))
    return table


# ---- 6. the whole pipeline and the preset ----------------------------------------------------

EXAMPLE_PROMPTS = 4


def run(s: Settings, out: Path, controls: bool = True, until: str | None = None) -> dict:
    torch.set_num_threads(s.threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log(f"data: {s.keys} keys, {s.operands} operands, composition over {s.train_share:.0%} of the keys -> {out / 'data'}")
    splits = make_data(s, out)
    kv, files = splits["kv"], splits["files"]
    base = train_base(s, kv, files, out)
    A, B, tok = base["augment"], base["anchor"], base["tokenizer"]
    if until == "base":
        return {"base": base}
    calm, comp = compose(s, B, A, tok, files, out / "bridge")
    columns = {"m_A": (A, tok), "m_B": (B, tok), "CALM": (calm, None)}
    times = {**base["times"], "compose_s": comp["seconds"]}
    if controls:
        tuned, times["finetune_s"] = finetune_anchor(s, out / "anchor", files)
        random_a = build_model(tok, s.augment_layers, s.width, seed=s.seed + 99, digit_embeddings=False).eval()
        calm_random, rand = compose(s, B, random_a, tok, files, None, label="CALM with random m_A")
        times["compose_random_s"] = rand["seconds"]
        columns["m_B fine-tuned (20% keys)"] = (tuned, tok)
        columns["CALM with random m_A"] = (calm_random, None)
    t = time.perf_counter()
    table = {row: {col: round(v, 1) for col, v in cols.items()}
             for row, cols in evaluate_all(columns, files, s.operands, s.eval_examples).items()}
    times["evaluate_s"] = time.perf_counter() - t
    times["total_s"] = time.perf_counter() - t0
    from .report import PAPER_TABLE, markdown, protocol, save

    print("\n" + markdown(table, settings=asdict(s)) + "\n", flush=True)
    meta = {"settings": asdict(s), "times_s": {k: round(v, 1) for k, v in times.items()},
            "eval_examples": s.eval_examples, "compose_history": comp["history"]}
    save(table, out, meta)
    held = files["eval_kv_math_heldout"]
    preset = {
        "name": "kv_arithmetic",
        "title": "Key-value arithmetic (CALM paper, section 4.1)",
        "description": (
            f"m_A (augmenting, {s.augment_layers}x{s.width}) memorised {s.keys} string keys -> integer values and never saw "
            f"arithmetic; m_B (anchor, {s.anchor_layers}x{s.width}) does +/- arithmetic and never saw a key. The bridge "
            f"was trained on arithmetic over {s.train_share:.0%} of the keys only; try expressions over the other keys. "
            f"Measured on held-out keys: CALM {table['KV-MATH (held-out keys)']['CALM']:.1f}% exact "
            f"(m_A {table['KV-MATH (held-out keys)']['m_A']:.1f}%, m_B {table['KV-MATH (held-out keys)']['m_B']:.1f}%), "
            f"scored on the result after the values the anchor restates. The paper's 84.3% is for another protocol "
            f"(composition on KV-SUBS, KV-MATH answered with the number alone): see table.md."),
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
        "eval_scoring": {"KV-SUBS": "substitution", "NUM-MATH": "result", "KV-MATH (held-out keys)": "result",
                         "KV-MATH (train keys)": "result"},
        "train_file": "data/composition_train.jsonl",
        "validation_file": "data/composition_validation.jsonl",
        "anchor": "anchor", "augment": "augment", "bridge": "bridge",
        "settings": asdict(s),
        "times_s": meta["times_s"],
    }
    (out / "preset.json").write_text(json.dumps(preset, indent=2))
    log(f"done in {times['total_s']:.0f}s -> {out}")
    return {"table": table, "times": times, "preset": preset}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m demos.kv_arithmetic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="presets/kv_arithmetic", help="output folder (the app's preset)")
    p.add_argument("--smoke", action="store_true", help="a tiny run (< 1 minute) that exercises every stage")
    p.add_argument("--until", choices=["base"], help="stop after training the base models")
    p.add_argument("--no-controls", action="store_true", help="skip the fine-tuned anchor and random m_A controls")
    add_settings_arguments(p, Settings)
    args = p.parse_args(argv)
    s = apply_arguments(Settings.smoke() if args.smoke else Settings(), args)
    run(s, Path(args.out), controls=not args.no_controls, until=args.until)
