"""The whole translation demo: language -> data -> base models -> composition -> controls -> table -> preset.

    python -m demos.translation                    # full pipeline, writes presets/translation/
    python -m demos.translation --smoke --out /tmp/translation_smoke

The base-model trainer and model builder (demos.kv_arithmetic.base), the bridge training with
calm_core's Trainer and the fine-tuned-anchor control (demos.kv_arithmetic.pipeline) are the
key-value demo's, imported, not copied; every score comes from calm_core.training.evaluation.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from demos.kv_arithmetic.base import add_settings_arguments, apply_arguments, build_model
from demos.kv_arithmetic.pipeline import compose_with_controls
from demos.run_folder import start_run

from . import language as L
from .base import log, train_base
from .report import CHRF_HELDOUT as CHRF_HELDOUT_ROW


@dataclass
class Settings:
    seed: int = 0
    parallel: int = 1000  # the small parallel set (sentence pairs; of ~2.4M possible sentences)
    validation: int = 40
    heldout: int = 150  # held-out sentences: new combinations, every lemma seen in the parallel set
    dictionary: int = 0  # copies of the word list ("nobi = dog", one per lemma) mixed into the parallel set
    phrases: bool = False  # also the parallel sentences' noun phrases as pairs ("vo nobi tusat = the big dog")
    # base models (from scratch; m_A: the made-up language only, m_B: English only)
    layers: int = 4
    width: int = 128
    augment_steps: int = 200  # both languages are near their entropy floor (~0.5 nats/char) by then
    anchor_steps: int = 200
    base_batch: int = 64
    base_lr: float = 3e-3
    # composition (the bridge)
    compose_anchor_layers: list[int] = field(default_factory=lambda: [0, 1, 2, 3])  # every anchor layer
    compose_augment_layers: list[int] = field(default_factory=lambda: [1, 1, 3, 3])
    gate: str = "none"  # the paper's plain residual add; a tanh gate that starts closed learned far slower here
    compose_insert: str = "after"  # the bridge reads and writes each anchor layer's output (the paper)
    compose_recency: int = 0
    compose_null_slot: bool = False
    compose_window: int = 0
    compose_steps: int = 1200
    compose_batch: int = 16
    compose_lr: float = 3e-3
    compose_noise: float = 0.0  # Gaussian noise on m_A states while the bridge trains (TrainConfig.augment_noise)
    # control: the anchor fine-tuned directly on the parallel set (same batch size as the bridge)
    finetune_steps: int = 1200
    finetune_lr: float = 1e-3
    # evaluation
    seen_examples: int = 50  # parallel-set sentences translated again (memorised vs generalised)
    max_new_tokens: int = 48
    threads: int = 1
    reuse_base: bool = False

    @classmethod
    def smoke(cls) -> Settings:
        return cls(parallel=60, validation=8, heldout=12, layers=2, width=32, augment_steps=15, anchor_steps=15,
                   base_batch=16, compose_anchor_layers=[1], compose_augment_layers=[1], compose_steps=8,
                   compose_batch=8, finetune_steps=8, seen_examples=6, max_new_tokens=12)


# ---- 1. data ---------------------------------------------------------------------------------

def make_data(s: Settings, out: Path) -> dict:
    """The language, its splits and the files (JSON Lines, prompt/completion, like any upload)."""
    lang = L.make_language(s.seed)
    splits = L.make_splits(lang, s.parallel, s.validation, s.heldout, seed=s.seed)
    pairs = lambda sentences: [lang.pair(x) for x in sentences]
    words = [(f"{lang.lexicon[w]}{L.SEPARATOR}", w) for w in lang.lexicon] * s.dictionary
    if s.phrases:
        words += [(lang.foreign_np(np, object_case=obj) + L.SEPARATOR, lang.english_np(np))
                  for x in splits.parallel for np, obj in ((x.subject, False), (x.object, True))]
    files = {
        "composition_train": pairs(splits.parallel) + words,
        "composition_validation": pairs(splits.validation),
        "eval_heldout": pairs(splits.heldout),
        "eval_seen": pairs(splits.parallel[:s.seen_examples]),
    }
    data = out / "data"
    for name, rows in files.items():
        L.write_jsonl(data / f"{name}.jsonl", [{"prompt": p, "completion": c} for p, c in rows])
    # held-out text of each language alone: the base models' own skills (a loss, no generation)
    L.write_jsonl(data / "english_heldout.jsonl", [{"text": lang.english(x)} for x in splits.heldout])
    L.write_jsonl(data / "foreign_heldout.jsonl", [{"text": lang.foreign(x)} for x in splits.heldout])
    coverage = splits.coverage()
    (out / "language.json").write_text(json.dumps({**lang.to_dict(), "coverage": coverage}, indent=2))
    return {"language": lang, "splits": splits, "files": files, "coverage": coverage}


# ---- 3-4. the bridge and the fine-tuned-anchor control: the key-value demo's, on the parallel set

def random_english_baseline(lang, references: list[str], seed: int) -> dict:
    """chrF / BLEU of a random sentence of the English grammar against each reference: what
    fluent English that ignores the foreign sentence scores (shared character n-grams such as
    "the " and "some " are worth something under chrF)."""
    import random

    from calm_core.training.evaluation import text_scores

    rng = random.Random(seed + 5)
    scores, _ = text_scores([lang.english(lang.sentence(rng)) for _ in references], references)
    return {k: round(v, 1) for k, v in scores.items()}


def measured_summary(table: dict, n: int) -> str:
    chrf = table[CHRF_HELDOUT_ROW]
    text = (f"Measured on {n} held-out sentences, chrF: CALM {chrf['CALM']:.1f} (m_A {chrf['m_A']:.1f}, "
            f"m_B {chrf['m_B']:.1f}; the paper's FLORES-200 average, 46.1 vs 41.7 for m_B, is for real languages: "
            f"another task, see table.md)")
    if "m_B fine-tuned (parallel set)" in chrf:
        text += (f"; controls: m_B fine-tuned directly on the parallel set {chrf['m_B fine-tuned (parallel set)']:.1f}, "
                 f"CALM with a random m_A {chrf['CALM with random m_A']:.1f}: the parallel set teaches what the "
                 f"held-out sentences need, so this shows a bridge learning translation from it with some help "
                 f"from m_A, not the anchor using m_A's knowledge")
    return text + "."


# ---- 5. the whole pipeline and the preset ----------------------------------------------------

EXAMPLE_PROMPTS = 4


def run(s: Settings, out: Path, controls: bool = True, until: str | None = None) -> dict:
    from .report import PAPER_TABLE, evaluate_all, markdown, protocol, save

    out, t0 = start_run(out, s.threads)
    data = make_data(s, out)
    lang, files = data["language"], data["files"]
    log(f"data: {len(lang.lexicon)} lemmas, {s.parallel} parallel pairs, {s.heldout} held-out sentences "
        f"({data['coverage']['heldout_sentences_all_lemmas_seen']} with every lemma seen in the parallel set) -> {out / 'data'}")
    base = train_base(s, data, out)
    tok = base["tokenizer"]
    if until == "base":
        return {"base": base}
    random_augment = (lambda: build_model(tok, s.layers, s.width, seed=s.seed + 99, max_positions=128,
                                          digit_embeddings=False)) if controls else None
    columns, comp, times = compose_with_controls(s, base, files, out, random_augment, "m_B fine-tuned (parallel set)",
                                                 "the parallel set")
    t = time.perf_counter()
    table, preds, signatures = evaluate_all(columns, files, lang, data["splits"].heldout, s.max_new_tokens)
    times["evaluate_s"] = time.perf_counter() - t
    times["total_s"] = time.perf_counter() - t0
    baseline = random_english_baseline(lang, [c for _, c in files["eval_heldout"]], s.seed)
    print("\n" + markdown(table, meta={"settings": asdict(s), "coverage": data["coverage"],
                                       "random_english_baseline": baseline}) + f"\n\nA random grammatical English sentence per reference scores chrF "
          f"{baseline['chrf']:.1f}, BLEU {baseline['bleu']:.1f}.\n", flush=True)
    times_s = {k: round(v, 1) for k, v in times.items()}
    held = files["eval_heldout"]
    samples = [{"prompt": p, "reference": c, **{col: preds[col][i] for col in preds}} for i, (p, c) in enumerate(held[:20])]
    save(table, out, {"settings": asdict(s), "times_s": times_s, "signatures": signatures, "coverage": data["coverage"],
                      "compose_history": comp["history"], "samples": samples,
                      "random_english_baseline": baseline})
    preset = {
        "name": "translation",
        "title": "Made-up language -> English (CALM paper, section 4.2, in miniature)",
        "description": (
            f"m_A (augmenting, {s.layers}x{s.width}) learned only a made-up language (a {len(lang.lexicon)}-word lexicon, "
            f"subject-object-verb order, adjectives after nouns, a plural suffix); m_B (anchor, {s.layers}x{s.width}) "
            f"learned only English. The bridge was trained on {s.parallel} parallel sentences; try held-out ones "
            f"(foreign sentence + '{L.SEPARATOR.strip()} '). Lexicon and rules: language.json. " + measured_summary(table, s.heldout)),
        "example_prompts": [p for p, _ in held[:EXAMPLE_PROMPTS]],
        "table": table,
        "paper_table": PAPER_TABLE,
        "paper_table_title": ("Ours beside the paper's Table 2 (FLORES-200, XX -> English, chrF; the paper's figure is its "
                              "10-language average): another task, not the same protocol, see protocol"),
        "protocol": protocol(asdict(s), data["coverage"]),
        "metrics": ["chrf", "bleu", "exact_match"],
        "eval_files": {"held-out sentences": "data/eval_heldout.jsonl", "parallel-set sentences": "data/eval_seen.jsonl"},
        "train_file": "data/composition_train.jsonl",
        "validation_file": "data/composition_validation.jsonl",
        "anchor": "anchor", "augment": "augment", "bridge": "bridge",
        "max_new_tokens": s.max_new_tokens,
        # how the Evaluate tab measures each set, as the table was measured
        "eval_max_new_tokens": s.max_new_tokens,
        "eval_table_rows": {"held-out sentences": {"chrf": "chrF, held-out sentences", "bleu": "BLEU, held-out sentences",
                                                   "exact_match": "exact match %, held-out sentences"},
                            "parallel-set sentences": {"chrf": "chrF, parallel-set sentences"}},
        "settings": asdict(s),
        "times_s": times_s,
    }
    (out / "preset.json").write_text(json.dumps(preset, indent=2))
    log(f"done in {times['total_s']:.0f}s -> {out}")
    return {"table": table, "times": times, "preset": preset, "coverage": data["coverage"]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m demos.translation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="presets/translation", help="output folder (the app's preset)")
    p.add_argument("--smoke", action="store_true", help="a tiny run (< 1 minute) that exercises every stage")
    p.add_argument("--until", choices=["base"], help="stop after training the base models")
    p.add_argument("--no-controls", action="store_true", help="skip the fine-tuned anchor and random m_A controls")
    add_settings_arguments(p, Settings)
    args = p.parse_args(argv)
    s = apply_arguments(Settings.smoke() if args.smoke else Settings(), args)
    run(s, Path(args.out), controls=not args.no_controls, until=args.until)
