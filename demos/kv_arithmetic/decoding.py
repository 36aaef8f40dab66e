"""Greedy decoding and exact match for a bare base model of the key-value demo (no padding: prompts are
batched by their length in tokens)."""
from __future__ import annotations

from typing import Callable

import torch

from .base import token_ids


@torch.no_grad()
def greedy(model, tokenizer, prompts: list[str], max_new_tokens: int = 12, batch_size: int = 256,
           forward: Callable | None = None) -> list[str]:
    """Greedy continuations, batched by prompt length in tokens (no padding needed).
    forward(ids) -> logits replaces model(ids).logits (e.g. a composed model)."""
    inv = {i: c for c, i in tokenizer.get_vocab().items()}
    special = set(tokenizer.all_special_ids)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    forward = forward or (lambda ids: model(input_ids=ids).logits)
    out = [""] * len(prompts)
    encoded = [[bos] + token_ids(tokenizer, p) for p in prompts]
    groups: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        groups.setdefault(len(ids), []).append(i)
    for _, idx in sorted(groups.items()):
        for s in range(0, len(idx), batch_size):
            chunk = idx[s:s + batch_size]
            ids = torch.tensor([encoded[i] for i in chunk])
            done = torch.zeros(len(chunk), dtype=torch.bool)
            gen = [[] for _ in chunk]
            for _ in range(max_new_tokens):
                nxt = forward(ids)[:, -1].argmax(-1)
                for j, t in enumerate(nxt.tolist()):
                    if not done[j]:
                        if t == eos:
                            done[j] = True
                        elif t not in special:
                            gen[j].append(inv.get(t, ""))
                if done.all():
                    break
                ids = torch.cat([ids, nxt[:, None]], 1)
            for j, i in enumerate(chunk):
                out[i] = "".join(gen[j])
    return out


def exact_match_bare(model, tokenizer, rows: list[tuple[str, str]], max_new_tokens: int = 12, forward=None) -> float:
    if not rows:
        return float("nan")
    preds = greedy(model, tokenizer, [p for p, _ in rows], max_new_tokens, forward=forward)
    return sum(p.strip() == c.strip() for p, (_, c) in zip(preds, rows)) / len(rows)
