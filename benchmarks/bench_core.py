"""Speed of composition against the frozen models alone (issue 2's benchmark pair).

Anchor: GPT-2, 12 layers x 256; augment: GPT-2, 8 layers x 192; vocab 512; CALMConfig(every=4).
  generation: composed greedy 64 new tokens vs anchor.generate + augment.generate (HF, cached)
  training:   composed forward + backward into the bridge (batch 8 x 128) vs the anchor's
              forward + backward to its inputs plus the augment's forward
Run: python -m benchmarks.bench_core [--threads 2] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from calm_core import CALMConfig, ComposedLM
from calm_core.tiny import bpe_tokenizer, char_tokenizer, tiny_model

CORPUS = [f"the {w} number {i} jumps over {j} lazy dogs and {w}s" for i, j, w in
          zip(range(400), range(400, 0, -1), ["cat", "fox", "bird", "tree"] * 100)]


def timed(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build(different_tokenizers: bool):
    tok = bpe_tokenizer(CORPUS, vocab_size=512)
    aug_tok = char_tokenizer() if different_tokenizers else tok
    anchor = tiny_model("gpt2", 512, layers=12, width=256, heads=8, seed=0, max_positions=1024)
    augment = tiny_model("gpt2", max(512, len(aug_tok)), layers=8, width=192, heads=6, seed=1, max_positions=1024)
    calm = ComposedLM((anchor, tok), [(augment, aug_tok)], CALMConfig(every=4))
    with torch.no_grad():  # open gates, so that nothing is skipped and outputs differ from the anchor
        for block in calm.bridge.blocks():
            block.gate.fill_(0.5)
    return calm, tok, aug_tok


def bench_generation(calm, tok, aug_tok, repeats, new_tokens=64):
    prompt = "the fox number 12 jumps over"
    anchor, augment = calm.anchor.model, calm.augments[0].model
    a_ids = tok(prompt, return_tensors="pt")["input_ids"]
    b_ids = aug_tok(prompt, return_tensors="pt")["input_ids"]
    hf = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)

    def baseline():
        with torch.no_grad():
            anchor.generate(a_ids, **hf)
            augment.generate(b_ids, **hf)

    def composed():
        with torch.no_grad():
            out = calm.generate(prompt, max_new_tokens=new_tokens, return_dict=True)
        return out

    # The composed run must produce all 64 tokens for the comparison to be fair.
    from calm_core import generation
    stop = generation.eos_ids
    generation.eos_ids = lambda calm: set()
    try:
        assert len(composed().token_ids) == new_tokens
        t_base, t_comp = timed(baseline, repeats), timed(composed, repeats)
        t_nocache = timed(lambda: calm.generate(prompt, max_new_tokens=new_tokens, use_cache=False), max(1, repeats // 2))
    finally:
        generation.eos_ids = stop
    return {"anchor+augment generate s": t_base, "composed generate s": t_comp, "ratio": t_comp / t_base,
            "composed without cache s": t_nocache, "no-cache ratio": t_nocache / t_base}


def bench_training(calm, repeats, batch=8, length=128):
    anchor, augment = calm.anchor.model, calm.augments[0].model
    texts = [" ".join(CORPUS[i * 7:(i * 7) + 12]) for i in range(batch)]
    enc = calm.encode(texts, max_length=length)
    ids = enc.anchor.input_ids[:, :length]
    assert ids.shape[1] == length, ids.shape
    aug_ids = enc.augments[0].input_ids[:, :length]

    def baseline():
        embeds = anchor.get_input_embeddings()(ids).detach().requires_grad_(True)
        anchor(inputs_embeds=embeds).logits.float().logsumexp(-1).mean().backward()
        with torch.no_grad():
            augment(input_ids=aug_ids)

    def composed():
        calm.bridge.zero_grad(set_to_none=True)
        calm.forward(enc).float().logsumexp(-1).mean().backward()

    t_base, t_comp = timed(baseline, repeats), timed(composed, repeats)
    tokens = batch * length
    return {"anchor fwd+bwd + augment fwd s": t_base, "composed step s": t_comp, "ratio": t_comp / t_base,
            "composed tokens/s": tokens / t_comp}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    for name, different in [("shared tokenizer", False), ("different tokenizers", True)]:
        calm, tok, aug_tok = build(different)
        results[name] = {"generation": bench_generation(calm, tok, aug_tok, args.repeats)}
        if not different:
            results[name]["training"] = bench_training(calm, args.repeats)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
