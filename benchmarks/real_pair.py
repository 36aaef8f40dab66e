"""Speed at real scale: Gemma 3 270M anchor + SmolLM2-135M-Instruct augment, every=5 (6 composition layers).

    python -m calm_core.models.real_pair                  # once: prepare the pair (the app does it at first use)
    python -m benchmarks.real_pair [--quick] [--threads 2] [--out PATH]

Measured, each against the frozen models alone in the same process (ratios are what to read):
  load       seconds to load each model from the prepared folder and to compose them; peak RSS
  generate   composed cached greedy decoding of 64 tokens from a 32-token prompt, against the
             anchor's and the augment's own cached `generate` of 64 tokens added together
  train      one composed training step (Trainer, batch 8 x 128 anchor tokens, frozen-state cache off and on),
             against the anchor's forward + backward to its input embeddings plus the augment's forward on the
             same texts, rounds interleaved (train_floor.py)
  evaluate   greedy answers to N short prompts (16 new tokens), one by one against batched
Also the batched-evaluation speed-up on the benchmark pair (benchmarks/models.py, shared tokenizer).
Without the prepared pair, the real-pair part is skipped with a note. Random gates at 0.5, EOS off.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from calm_core import CALMConfig, ComposedLM, load_causal_lm
from calm_core.models.real_pair import PREPARE_COMMAND, prepared_pair

from . import models
from .gen_speed import hf_generate, no_eos
from .measure import median_seconds, peak_rss_mib

TOPICS = ["the river", "a small town", "the old library", "winter markets", "the mountain road", "a clockmaker",
          "the harbour", "glass bridges", "a village school", "the northern forest", "a lighthouse keeper"]


def passages(tokenizer, count: int, tokens: int) -> list[str]:
    """Plain English passages of at least `tokens` anchor tokens."""
    out = []
    for i in range(count):
        words = [f"This is a story about {TOPICS[i % len(TOPICS)]} number {i}."]
        while len(tokenizer(" ".join(words))["input_ids"]) < tokens:
            words.append(f"On day {len(words)} people walked past {TOPICS[(i + len(words)) % len(TOPICS)]} and talked.")
        out.append(" ".join(words))
    return out


def load(results: dict) -> ComposedLM:
    pair, loaded = prepared_pair(), {}
    for key in ("gemma", "smollm2"):
        start = time.perf_counter()
        loaded[key] = load_causal_lm(str(pair[key]))
        results[f"load_{key}_s"] = time.perf_counter() - start
    start = time.perf_counter()
    calm = models.open_gates(ComposedLM(loaded["gemma"], [loaded["smollm2"]], CALMConfig(every=5)))
    results["compose_s"] = time.perf_counter() - start
    results["bridge_parameters"] = calm.num_parameters()[0]
    results["peak_rss_after_load_mib"] = peak_rss_mib()
    return calm


def generation(calm, results: dict, new_tokens: int, repeats: int) -> None:
    anchor, augment = calm.anchor, calm.augments[0]
    text = passages(anchor.tokenizer, 1, 32)[0]
    text = anchor.tokenizer.decode(anchor.tokenizer(text, add_special_tokens=False)["input_ids"][:31])

    def ours():
        with no_eos():
            assert len(calm.generate(text, max_new_tokens=new_tokens, return_dict=True).token_ids) == new_tokens
    ids = {m.info.name: m.tokenizer(text, return_tensors="pt")["input_ids"] for m in (anchor, augment)}
    seconds = {
        "ours": median_seconds(ours, repeats),
        "anchor_hf": median_seconds(lambda: hf_generate(anchor.model, ids[anchor.info.name], new_tokens), repeats),
        "augment_hf": median_seconds(lambda: hf_generate(augment.model, ids[augment.info.name], new_tokens), repeats),
    }
    results["generate"] = {**{f"{k}_s": v for k, v in seconds.items()},
                           "ratio_vs_both_models": seconds["ours"] / (seconds["anchor_hf"] + seconds["augment_hf"])}


def training(calm, results: dict, batch: int, length: int, rounds: int) -> None:
    """One composed training step (cache off and on) against the frozen models' floor: train_floor.py."""
    from .train_floor import measure

    results["train"] = measure(calm, batch, length, rounds)


def evaluation(calm, results: dict, key: str, prompts: list[str], new_tokens: int, batch_size: int) -> None:
    with no_eos():
        start = time.perf_counter()
        alone = [calm.generate(p, max_new_tokens=new_tokens) for p in prompts]
        one_by_one = time.perf_counter() - start
        start = time.perf_counter()
        together = []
        for i in range(0, len(prompts), batch_size):
            together += calm.generate(prompts[i:i + batch_size], max_new_tokens=new_tokens)
        batched = time.perf_counter() - start
    results[key] = {"prompts": len(prompts), "new_tokens": new_tokens, "batch_size": batch_size,
                    "one_by_one_s": one_by_one, "batched_s": batched, "speedup": one_by_one / batched,
                    "identical_answers": sum(a == b for a, b in zip(alone, together))}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and prompts (about 4 minutes)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/real_pair.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = {"threads": args.threads, "quick": args.quick, "torch": torch.__version__}
    setup = models.build(models.FULL)
    prompts = [f"{t} " for t in models.texts(setup.tokenizer, 256, 12)]
    prompts = [setup.tokenizer.decode(setup.tokenizer(p)["input_ids"][:12]) for p in prompts]
    evaluation(setup.calm, results, "evaluate_benchmark_pair", prompts[:64 if args.quick else 256], 8, 32)
    if prepared_pair() is None:
        results["real_pair"] = f"skipped: the pair is not prepared ({PREPARE_COMMAND})"
    else:
        with torch.no_grad():
            calm = load(results)
        generation(calm, results, 64, 2 if args.quick else 3)
        training(calm, results, 8, 128, 2 if args.quick else 4)
        questions = [f"Question: Where is {t}? Answer:" for t in TOPICS] * 6
        evaluation(calm, results, "evaluate_real_pair", questions[:16 if args.quick else 64], 16, 32)
        results["peak_rss_mib"] = peak_rss_mib()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
