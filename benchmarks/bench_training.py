"""Bridge training throughput with and without the augmenting-state cache, against the anchor's
own forward + backward, on the core benchmark pair (GPT-2 12x256 anchor, 8x192 augment, vocab
512, every=4), batch 8 x 128 tokens, 2 threads.

Run: python -m benchmarks.bench_training [--steps 12]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from calm_core.batches import collate, prepare, token_losses
from calm_core.data import Example
from calm_core.training import TrainConfig, Trainer

from .bench_core import CORPUS, build


def anchor_tokens_per_s(calm, rows, steps, batch):
    """The anchor alone: forward + backward to its inputs on the same batches."""
    anchor = calm.anchor.model
    start = None
    for step in range(steps + 2):
        if step == 2:
            start, tokens = time.perf_counter(), 0
        picked = rows[(step * batch) % len(rows):][:batch]
        enc, labels = collate(calm, picked)
        embeds = anchor.get_input_embeddings()(enc.anchor.input_ids).detach().requires_grad_(True)
        logits = anchor(inputs_embeds=embeds, attention_mask=enc.anchor.attention_mask.long()).logits
        token_losses(logits, labels).mean().backward()
        if start is not None:
            tokens += int(enc.anchor.attention_mask.sum())
    return tokens / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    calm, tok, _ = build(different_tokenizers=False)
    text = " ".join(CORPUS)
    examples = [Example("", text[i * 97:i * 97 + 600]) for i in range(64)]  # 64 examples, 128 tokens each
    config = dict(steps=args.steps, batch_size=8, lr=1e-4, log_every=1, eval_every=10**6, progress=False, max_length=128)
    results = {}
    for cache in (False, True):
        trainer = Trainer(calm, examples, None, TrainConfig(cache_augment_states=cache, **config))
        start = time.perf_counter()
        result = trainer.train()
        elapsed = time.perf_counter() - start
        tokens = sum(len(r.anchor_ids) for r in trainer.train_rows) * args.steps * 8 / len(trainer.train_rows)
        # steady state: the median over steps after the first epoch (64 examples = 8 steps) fills the cache
        steady = sorted(h["tokens_per_s"] for h in result.history[8:]) or [tokens / elapsed]
        results["with cache" if cache else "without cache"] = {
            "tokens/s overall": tokens / elapsed, "tokens/s steady": steady[len(steady) // 2], "cache used": result.augment_cache}
    rows, _ = prepare(calm, examples, max_length=128)
    results["anchor alone fwd+bwd tokens/s"] = anchor_tokens_per_s(calm, rows, args.steps, 8)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
