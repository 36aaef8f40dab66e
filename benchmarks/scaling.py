"""How the composition's cost grows with context length and with the number of composition layers.

Context length: training keeps the tokens per step fixed (batch = tokens_per_step // length), so
that what grows is attention's cost, not the batch; generation is new_tokens tokens after a prompt
of that length. Each is set beside the frozen models' own cost at the same length (the anchor's
forward + backward; anchor + augment cached generate), which is the floor composition adds to.
Composition layers: CALMConfig(every=e) over the same models, training at the main batch and
generation from the main prompt, with the bridge's trainable parameters.

Ours only: calm-pytorch regenerates without a cache, so long prompts would cost minutes per run.
Everything runs in this process; only times are taken here, no memory.
"""
from __future__ import annotations

import dataclasses

from . import gen_speed, models, train_speed


def context(setup: models.Setup, lengths, tokens_per_step: int, new_tokens: int, steps: int, warmup: int,
            repeats: int) -> list[dict]:
    rows = []
    for length in lengths:
        batch = max(1, tokens_per_step // length)
        ours, anchor = (train_speed.measure(system, setup.shapes, batch, length, steps, warmup, setup)
                        for system in ("ours", "anchor"))
        text, ids = models.prompt(setup.tokenizer, length)
        gen = gen_speed.measure(setup.calm, text, ids, new_tokens, repeats, systems=("ours", "anchor_hf", "augment_hf"))
        frozen = gen["anchor_hf"]["s"] + gen["augment_hf"]["s"]
        rows.append({
            "length": length, "batch": batch,
            "train_step_s": ours["step_s"], "train_tokens_per_s": ours["tokens_per_s"],
            "anchor_step_s": anchor["step_s"], "train_vs_anchor": ours["step_s"] / anchor["step_s"],
            "gen_s": gen["ours"]["s"], "gen_tokens_per_s": gen["ours"]["tokens_per_s"],
            "frozen_gen_s": frozen, "gen_vs_frozen": gen["ours"]["s"] / frozen,
        })
    return rows


def composition_layers(setup: models.Setup, everys, batch: int, length: int, prompt_tokens: int, new_tokens: int,
                       steps: int, warmup: int, repeats: int) -> list[dict]:
    text, ids = models.prompt(setup.tokenizer, prompt_tokens)
    rows = []
    for every in everys:
        variant = dataclasses.replace(setup, calm=models.compose(setup, every))
        train = train_speed.measure("ours", setup.shapes, batch, length, steps, warmup, variant)
        gen = gen_speed.measure(variant.calm, text, ids, new_tokens, repeats, systems=("ours",))["ours"]
        rows.append({
            "every": every, "layers": len(variant.calm.bridge.blocks()),
            "pairs": [(anchor, augment) for _, anchor, augment in variant.calm.layer_pairs()],
            "trainable": variant.calm.num_parameters()[0],
            "train_step_s": train["step_s"], "train_tokens_per_s": train["tokens_per_s"],
            "gen_s": gen["s"], "gen_tokens_per_s": gen["tokens_per_s"],
        })
    return rows
