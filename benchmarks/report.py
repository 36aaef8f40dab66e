"""The goals, the markdown tables and the JSON file, from the results run.py collects.

Goals are ratios within one run (issue 6), because absolute timings on these machines move with
whatever else runs beside them; the ratio's inputs are in the tables above it.
"""
from __future__ import annotations

import json
from pathlib import Path

FLAT_MIB_PER_STEP = 0.1  # "flat": under 20 MiB over 200 steps, against calm-pytorch's tens of MiB per step

TRAIN_NAMES = {"ours": "ours, no cache", "ours_cached": "ours, augment cache", "peer": "calm-pytorch",
               "anchor": "anchor alone, fwd+bwd"}
GEN_NAMES = {"ours": "ours, KV caches", "ours_uncached": "ours, no cache", "peer": "calm-pytorch",
             "anchor_hf": "anchor alone (HF generate)", "augment_hf": "augment alone (HF generate)",
             "ours_char": "ours, character-level augment (re-tokenized each step)",
             "char_augment_hf": "character-level augment alone (HF generate; its tokens are characters)"}


def goals(results: dict) -> list[dict]:
    train, gen = results["training"], results["generation"]
    peer_train, peer_gen = "tokens_per_s" in train.get("peer", {}), "tokens_per_s" in gen.get("peer", {})

    def goal(name, value, target, passed, needs_peer=False):
        if needs_peer and value is None:
            return {"goal": name, "value": None, "target": target, "status": "SKIP (no calm-pytorch)"}
        return {"goal": name, "value": value, "target": target, "status": "PASS" if passed(value) else "FAIL"}

    def vs_peer(table, system, present):
        return table[system]["tokens_per_s"] / table["peer"]["tokens_per_s"] if present else None

    frozen = gen["anchor_hf"]["s"] + gen["augment_hf"]["s"]
    growth = max(train[s]["rss_growth_mib_per_step"] for s in ("ours", "ours_cached"))
    return [
        goal("composed generation time / (anchor + augment cached generate)", gen["ours"]["s"] / frozen, "<= 1.3",
             lambda v: v <= 1.3),
        goal("generation tokens/s, ours / calm-pytorch", vs_peer(gen, "ours", peer_gen), ">= 1.6",
             lambda v: v >= 1.6, True),
        goal("training tokens/s without cache, ours / calm-pytorch", vs_peer(train, "ours", peer_train), ">= 1.3",
             lambda v: v >= 1.3, True),
        goal("training tokens/s with cache, ours / calm-pytorch", vs_peer(train, "ours_cached", peer_train), ">= 2",
             lambda v: v >= 2, True),
        goal(f"memory flat: ours' RSS growth, MiB/step over {train['ours']['steps']} steps", growth,
             f"<= {FLAT_MIB_PER_STEP}", lambda v: v <= FLAT_MIB_PER_STEP),
    ]


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,d}"
    return str(value)


def _ratio(table: dict, system: str) -> str:
    peer = table.get("peer", {})
    return f"{table[system]['tokens_per_s'] / peer['tokens_per_s']:.2f}x" if "tokens_per_s" in peer else "—"


def markdown(results: dict) -> str:
    s, out = results["settings"], []
    quick = ", quick: indicative only" if s["quick"] else ""
    out.append(f"## CALM benchmark ({s['shapes']} models, {s['threads']} threads{quick})")
    out.append(f"Anchor {results['models']['anchor']}, augment {results['models']['augment']}; "
               f"composition pairs (anchor layer, augment layer), 0-based: {results['models']['pairs']}.")

    train = results["training"]
    rows = []
    for system, name in TRAIN_NAMES.items():
        r = train.get(system, {})
        if "skipped" in r:
            rows.append([name, "skipped: " + r["skipped"], "", "", "", "", ""])
        elif r:
            rows.append([name, r["tokens_per_s"], r["step_s"], r["peak_rss_mib"], r["rss_growth_mib_per_step"],
                         r["steps"], _ratio(train, system)])
    out.append(f"### Training step, batch {s['batch']} x {s['length']}\n" + _table(
        ["system", "tokens/s", "step s", "peak RSS MiB", "RSS growth MiB/step", "timed steps", "vs calm-pytorch"], rows))

    gen = results["generation"]
    rows = []
    for system, name in GEN_NAMES.items():
        r = gen.get(system, {})
        if "skipped" in r:
            rows.append([name, "skipped: " + r["skipped"], "", ""])
        elif r:
            rows.append([name, r["s"], r["tokens_per_s"], _ratio(gen, system)])
    out.append(f"### Greedy generation, {s['new_tokens']} new tokens from {s['prompt_tokens']}, batch 1\n"
               + _table(["system", f"s per {s['new_tokens']} tokens", "tokens/s", "vs calm-pytorch"], rows))
    if "ours_char" in gen:
        frozen = gen["anchor_hf"]["s"] + gen["char_augment_hf"]["s"]
        out.append(f"Two tokenizers (no goal): composed time / (anchor + character-level augment generate) = "
                   f"{gen['ours_char']['s'] / frozen:.2f}; with one shared tokenizer: "
                   f"{gen['ours']['s'] / (gen['anchor_hf']['s'] + gen['augment_hf']['s']):.2f}.")

    out.append("### Parameters\n" + _table(
        ["system", "trainable", "total", "anchor", "augment"],
        [[name, p.get("trainable", "—"), p["total"], p.get("anchor", "—"), p.get("augment", "—")]
         for name, p in results["parameters"].items()]))

    scaling = results["scaling"]
    out.append(f"### Scaling with context length (training: {s['tokens_per_step']} tokens per step; "
               f"generation: {s['new_tokens']} tokens after a prompt of that length)\n" + _table(
                   ["length", "batch", "train tokens/s", "train step s", "vs anchor fwd+bwd", "gen s", "gen tokens/s",
                    "vs anchor + augment generate"],
                   [[r["length"], r["batch"], r["train_tokens_per_s"], r["train_step_s"], r["train_vs_anchor"],
                     r["gen_s"], r["gen_tokens_per_s"], r["gen_vs_frozen"]] for r in scaling["context"]]))
    out.append(f"### Scaling with composition layers (training batch {s['batch']} x {s['length']}, no cache)\n" + _table(
        ["every", "layers", "pairs", "trainable", "train tokens/s", "train step s", "gen s", "gen tokens/s"],
        [[r["every"], r["layers"], " ".join(f"{a}<-{b}" for a, b in r["pairs"]), r["trainable"],
          r["train_tokens_per_s"], r["train_step_s"], r["gen_s"], r["gen_tokens_per_s"]]
         for r in scaling["composition_layers"]]))

    out.append("### Goals\n" + _table(["goal", "value", "target", "status"],
                                      [[g["goal"], "—" if g["value"] is None else g["value"], g["target"], g["status"]]
                                       for g in results["goals"]]))
    out.append("### How calm-pytorch's setup differs\n" + "\n".join(f"- {d}" for d in results["peer"]["differences"]))
    out.append("### Notes\n" + "\n".join(f"- {n}" for n in results["notes"]))
    return "\n\n".join(out)


def write_json(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
