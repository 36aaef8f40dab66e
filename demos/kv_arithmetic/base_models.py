"""The two base models of a run: what each is trained on (recipe), training them side by side, and reusing them.

A run trains m_A and m_B from scratch, or keeps those already in its folder (`reuse_base`, unchecked), or
copies them from another run (`base_from`) when the record saved with each model (kv_settings.json, else the
run's table.json) shows that every setting that shapes it (settings.BASE_FIELDS) and the key table are the
same: so an ablation of the bridge retrains nothing, and one of m_B's recipe retrains m_B only.
"""
from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from . import data as D
from .base import build_model, load_model, log, make_tokenizer, save_model, train_lm
from .decoding import exact_match_bare
from .recipes import anchor_sampler, augment_sampler
from .settings import Settings, base_differences

BASE_TITLES = {"augment": "m_A (augmenting: knows D_KV, no arithmetic)",
               "anchor": "m_B (anchor: arithmetic, never a key of D_KV)"}


def recipe(name: str, s: Settings, kv: D.KVSpace) -> dict:
    """What base model `name` ("augment": m_A, "anchor": m_B) is trained on and with (recipes.py)."""
    if name == "augment":
        return dict(layers=s.augment_layers, steps=s.augment_steps, batch=s.augment_batch, seed=s.seed, warmup=50,
                    sampler=augment_sampler(kv.values, s.operands, lookup=s.augment_lookups,
                                            at_last_letter=s.augment_at_last_letter, end=s.kv_subs_end),
                    value_layers=s.augment_value_layers, noise=0.0, digit_embeddings=s.digit_embeddings)
    return dict(layers=s.anchor_layers, steps=s.anchor_steps, batch=s.anchor_batch, seed=s.seed + 1, warmup=100,
                sampler=anchor_sampler(s.keys, s.operands, forbidden=set(kv.values), labels=s.anchor_labels,
                                       merged=s.anchor_merged, restate=s.anchor_restate, given=s.anchor_given),
                value_layers=s.anchor_value_layers, noise=s.anchor_operand_noise, digit_embeddings=s.digit_embeddings)


def train_one_base(name: str, s: Settings, kv: D.KVSpace, files: dict, out: Path, threads: int) -> float:
    """Train m_A ("augment") or m_B ("anchor") from scratch and save it to out/name; returns seconds."""
    torch.set_num_threads(threads)
    tok = make_tokenizer(s.keys)
    r = recipe(name, s, kv)
    layers, steps, batch, seed, warmup = r["layers"], r["steps"], r["batch"], r["seed"], r["warmup"]
    sampler, value_layers, noise = r["sampler"], r["value_layers"], r["noise"]
    rows, metric = (files["eval_kv_subs"][:200], "kv_subs") if name == "augment" else (files["eval_num_math"][:200], "num_math")
    prefix = "m_A" if name == "augment" else "m_B"
    log(f"training {BASE_TITLES[name]}: {layers}x{s.width}, {steps} steps of {batch}, value heads on layers {value_layers}")
    (out / name).mkdir(parents=True, exist_ok=True)
    (out / name / TRAINED_WITH).write_text(json.dumps({"unfinished": True}))  # a partial model is never copied
    t = time.perf_counter()
    model = build_model(tok, layers, s.width, seed=seed, digit_embeddings=r["digit_embeddings"])

    def check():  # and keep what was learned so far
        save_model(model, tok, out / name)
        return {metric: exact_match_bare(model, tok, rows)}

    extra, probe = 0, None
    while True:
        train_lm(model, tok, sampler, steps, batch, s.base_lr, warmup=warmup, seed=seed + 1000 * extra,
                 log_every=max(1, steps // 20), eval_every=max(1, steps // 20) * 4, evaluate=check,
                 log=lambda m: log(f"{prefix}{m}"), value_layers=value_layers,
                 value_regression=name == "augment" and s.augment_value_regression,
                 operand_noise=noise, every_step=more_threads_when_alone(out, name, threads, s.threads))
        if name != "anchor" or not s.anchor_min_num_math:
            break
        probe = exact_match_bare(model, tok, anchor_probe(s))
        if probe >= s.anchor_min_num_math or extra >= s.anchor_extra_rounds:
            break
        extra += 1
        log(f"m_B computes {probe:.1%} of its NUM-MATH probe (< {s.anchor_min_num_math:.0%}): "
            f"training on, round {extra} of at most {s.anchor_extra_rounds} ({steps} steps, schedule restarted)")
    seconds = time.perf_counter() - t
    save_model(model, tok, out / name)
    record = {**asdict(s), "trained": {"steps": steps * (extra + 1), "extra_rounds": extra, "num_math_probe": probe}}
    (out / name / TRAINED_WITH).write_text(json.dumps(record))  # what a later run checks before copying it
    (out / f"{name}.done").touch()
    return seconds


def anchor_probe(s: Settings, n: int = 200) -> list[tuple[str, str]]:
    """m_B's own NUM-MATH probe: random expressions from a seed no data set uses (never an evaluation row)."""
    rng = random.Random(s.seed + 13)
    return [D.num_math_random(rng, s.keys, s.operands) for _ in range(n)]


def more_threads_when_alone(out: Path, name: str, threads: int, all_threads: int):
    """Side by side, each base model has half the threads; the one that finishes last takes them
    all once the other has saved its final model (checked every 20 steps)."""
    other = out / ("anchor.done" if name == "augment" else "augment.done")

    def check(step: int) -> None:
        if step % 20 == 0 and torch.get_num_threads() < all_threads and other.exists():
            torch.set_num_threads(all_threads)
            log(f"{name}: the other base model is done, now {all_threads} threads")
    return check


TRAINED_WITH = "kv_settings.json"  # in each base model's folder: the Settings it was trained with


def trained_with(run: Path, name: str) -> dict | None:
    """The settings base model run/name was trained with: its own record, else (older runs, the shipped
    preset) the run's table.json; None if unknown or unfinished."""
    for path, key in ((run / name / TRAINED_WITH, None), (run / "table.json", "settings")):
        if path.is_file():
            record = json.loads(path.read_text())
            record = record.get(key) if key else record
            return None if not record or record.get("unfinished") else record
    return None


def copy_base(name: str, s: Settings, kv: D.KVSpace, source: Path, out: Path) -> bool:
    """Copy base model `name` from the run folder `source` into out/ if it was trained on the same key table
    with every setting that shapes it as in s (settings.BASE_FIELDS); False (and why) otherwise."""
    record, kv_file = trained_with(source, name), source / "data" / "kv.json"
    why = ("no record of its settings" if record is None or not (source / name / "config.json").is_file() else
           "another key table" if not kv_file.is_file() or json.loads(kv_file.read_text())["values"] != kv.values
           else ", ".join(base_differences(name, record, s)))
    if why:
        log(f"not copying {BASE_TITLES[name]} from {source}: {why}; training it")
        return False
    if source.resolve() != out.resolve():
        shutil.copytree(source / name, out / name, dirs_exist_ok=True)
    log(f"copied {BASE_TITLES[name]} from {source / name} (the same settings shape it)")
    return True


def train_base(s: Settings, kv: D.KVSpace, files: dict, out: Path) -> dict:
    """Train m_A and m_B from scratch, side by side in two processes with s.parallel_base; reuse the ones in
    out/ with s.reuse_base (unchecked), or copy those from s.base_from that these settings do not change."""
    times_path = out / "base_times.json"
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    todo = [n for n in ("augment", "anchor") if not (s.reuse_base and (out / n / "config.json").exists())]
    copied = [n for n in todo if s.base_from and copy_base(n, s, kv, Path(s.base_from), out)]
    todo = [n for n in todo if n not in copied]
    for name in {"augment", "anchor"} - set(todo) - set(copied):
        log(f"reusing {BASE_TITLES[name]} from {out / name} (unchecked: --base-from checks its settings)")
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
    return {"augment": augment, "anchor": anchor, "tokenizer": tok, "times": times,
            "copied": {n: str(Path(s.base_from) / n) for n in copied}}
