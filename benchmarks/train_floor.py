"""The composed training step against its floor, on the real pair (issue 40, item 4).

    python -m benchmarks.train_floor [--rounds 5] [--anchor gemma|smollm2] [--profile]

The floor is what the frozen models cost for the same batch and tokens: the anchor's forward and backward (to its
input embeddings, loss on every position) plus the augmenting model's forward. Our step is one Trainer step (AdamW
on the bridge), with the frozen-state cache off (both models run every step) and on (the augmenting states and the
anchor's layers below the bridge read from the cache). Each round times one of each, in turn, in this process, so
the machine's drift touches all three alike; the ratios are of the medians over rounds. --profile prints the
operators that take the time in each (torch.profiler), which is how the extra was found.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from calm_core import CALMConfig, ComposedLM, load_causal_lm
from calm_core.models.real_pair import prepared_pair
from calm_core.training.batches import token_losses
from calm_core.training.data import Example
from calm_core.training.trainer import TrainConfig, Trainer

from . import models
from .real_pair import passages


def measure(calm, batch: int = 8, length: int = 128, rounds: int = 5, profile: bool = False) -> dict:
    """Median seconds per step of ours (cache off, cache on) and of the floor, rounds interleaved; their ratios."""
    tok, anchor, augment = calm.anchor.tokenizer, calm.anchor, calm.augments[0]
    texts = passages(tok, batch, length)
    trainers = {}
    for cached in (False, True):
        config = TrainConfig(steps=10**6, batch_size=batch, lr=1e-4, warmup_steps=1, eval_every=10**9,
                             max_length=length, cache_augment_states=cached, progress=False, accuracy_examples=0)
        trainers[cached] = Trainer(calm, [Example("", t) for t in texts], None, config)
    ids = torch.tensor([tok(t)["input_ids"][:length] for t in texts])
    aug = augment.tokenizer(texts, return_tensors="pt", padding=True)

    def floor():
        embeds = anchor.model.get_input_embeddings()(ids).detach().requires_grad_(True)
        token_losses(anchor.model(inputs_embeds=embeds).logits, ids).mean().backward()
        with torch.no_grad():
            augment.model(**aug)
    jobs = {"ours_cache_off": lambda: trainers[False]._train_step(False),
            "ours_cache_on": lambda: trainers[True]._train_step(True), "floor": floor}
    for job in jobs.values():  # warm-up: first calls, optimizer state, the cache filled
        job()
    seconds = {name: [] for name in jobs}
    for _ in range(rounds):
        for name, job in jobs.items():
            started = time.perf_counter()
            job()
            seconds[name].append(time.perf_counter() - started)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    result = {"batch": batch, "anchor_tokens": length, "augment_tokens": int(aug["input_ids"].shape[1]),
              "rounds": rounds, **{f"{k}_s": round(v, 3) for k, v in median.items()},
              "ratio_cache_off": round(median["ours_cache_off"] / median["floor"], 3),
              "ratio_cache_on": round(median["ours_cache_on"] / median["floor"], 3),
              "all_s": {k: [round(x, 3) for x in v] for k, v in seconds.items()}}
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        for name, job in jobs.items():
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                job()
            print(f"## {name}\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    return result


def real_pair(anchor: str = "gemma", every: int = 5) -> ComposedLM:
    """The prepared real pair composed with `anchor` as the anchor, gates open at 0.5 (a trained bridge's cost)."""
    pair = prepared_pair()
    if pair is None:
        raise SystemExit("the real pair is not prepared: python -m calm_core.models.real_pair")
    other = "smollm2" if anchor == "gemma" else "gemma"
    return models.open_gates(ComposedLM(load_causal_lm(str(pair[anchor])), [load_causal_lm(str(pair[other]))],
                                        CALMConfig(every=every)))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--anchor", choices=["gemma", "smollm2"], default="gemma")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    result = {"anchor": args.anchor, "threads": args.threads,
              **measure(real_pair(args.anchor), args.batch, args.length, args.rounds, args.profile)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
