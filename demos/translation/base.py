"""The base models, trained from scratch: m_A on the made-up language only, m_B on English only.

The trainer (AdamW, warmup + cosine, loss masks from segments) is the key-value demo's
`demos.kv_arithmetic.base.train_lm`, imported; what is the translation demo's own is what each
model reads, and a check of each on held-out text of its language.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from demos.kv_arithmetic.base import build_model, load_model, log, save_model, train_lm

from .language import ALPHABET


def make_tokenizer():
    """One token per character of both languages (they share the alphabet), with BOS."""
    from calm_core.models.tiny import char_tokenizer

    return char_tokenizer(ALPHABET, add_bos=True)


def monolingual_sampler(render, exclude: set[str]):
    """Sentences of one language from the grammar, never a held-out or parallel-set sentence, so
    neither base model has seen the evaluation sentences (nor the parallel set) even in its own
    language. The loss is on every character."""
    def sample(rng):
        while True:
            text = render(rng)
            if text not in exclude:
                return [(text, True)]
    return sample


@torch.no_grad()
def text_loss(model, tok, texts: list[str]) -> float:
    """Mean loss per character (nats) of a bare model on whole texts and their end token.
    (Not through calm_core.training.evaluation: wrapping a model in a ComposedLM freezes it, and this runs
    in the middle of its training.)"""
    vocab, total, count = tok.get_vocab(), 0.0, 0
    for text in texts:
        ids = torch.tensor([[tok.bos_token_id] + [vocab[c] for c in text] + [tok.eos_token_id]])
        n = ids.shape[1] - 1
        total, count = total + float(model(input_ids=ids, labels=ids).loss) * n, count + n
    return total / max(1, count)


def train_base(s, data: dict, out: Path) -> dict:
    """m_A on the made-up language only, m_B on English only (or reuse them with s.reuse_base)."""
    lang, splits = data["language"], data["splits"]
    tok = make_tokenizer()
    times_path = out / "base_times.json"
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    used = splits.parallel + splits.validation + splits.heldout
    held_en = [lang.english(x) for x in splits.heldout[:100]]
    held_fo = [lang.foreign(x) for x in splits.heldout[:100]]
    specs = {
        "augment": ("m_A (augmenting: the made-up language only)", s.augment_steps, s.seed,
                    monolingual_sampler(lambda r: lang.foreign(lang.sentence(r)), {lang.foreign(x) for x in used}),
                    held_fo),
        "anchor": ("m_B (anchor: English only)", s.anchor_steps, s.seed + 1,
                   monolingual_sampler(lambda r: lang.english(lang.sentence(r)), {lang.english(x) for x in used}),
                   held_en),
    }
    for name, (title, steps, seed, sampler, held) in specs.items():
        if s.reuse_base and (out / name / "config.json").exists():
            log(f"reusing {title} from {out / name}")
            continue
        log(f"training {title}: {s.layers}x{s.width}, {steps} steps of {s.base_batch}")
        t = time.perf_counter()
        model = build_model(tok, s.layers, s.width, seed=seed, max_positions=128, digit_embeddings=False)
        train_lm(model, tok, sampler, steps, s.base_batch, s.base_lr, warmup=min(50, steps // 5 + 1), seed=seed,
                 log_every=max(1, steps // 6), eval_every=max(1, steps // 3), log=log,
                 evaluate=lambda m=model, h=held: {"heldout_loss": text_loss(m, tok, h)})
        times[f"{name}_s"] = time.perf_counter() - t
        save_model(model, tok, out / name)
        times_path.write_text(json.dumps(times))
    # loaded back from disk, so that a bridge saved on them records where they live
    return {"augment": load_model(out / "augment")[0], "anchor": load_model(out / "anchor")[0], "tokenizer": tok,
            "times": times}
