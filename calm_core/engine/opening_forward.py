"""A batch whose rows open alike, run with that opening computed once: the composed forward of training.

Chat rows repeat one opening (SmolLM2's template puts its default system turn first: 24 of the real preset's 62
anchor tokens a row). With the frozen states cached, a training step's cost is the anchor above its frozen prefix
with the bridge, forward and backward, over every token of every row; over the opening that work is the same in
every row, since a causal model's states there depend on the opening alone, and the bridge's too when what it reads
from the augmenting model at those positions is the same in every row. So the opening runs once (batch 1), its keys
and values (with their gradients: the bridge writes into the opening as well) are repeated for the batch, and the
rest of every row continues from them: the same outputs and gradients as the whole batch, to float rounding.

Used only where that holds: every row's anchor tokens and mask agree over the opening and no target lies in it;
every augmenting model's tokens the opening can see agree in every row and nothing later is visible from it (the
check is on the visibility masks, so any alignment is covered); a sliding-window anchor's rows fit its window. With
augment noise on, each row's augmenting states carry their own noise, and the shared opening reads the first row's:
one draw for the opening, as one computation. Anything else (a model whose cache cannot be extended) runs whole.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext

import torch

log = logging.getLogger(__name__)

MIN_TOKENS = 8  # a shorter opening is not worth a second call


def forward_sharing_opening(calm, batch, condition, prefix: torch.Tensor | None, positions: torch.Tensor | None,
                            hidden_only: bool, device) -> torch.Tensor | None:
    """ComposedLM.forward's result (positions: a (B, T) target mask) with the rows' opening run once; None where the
    batch shares no usable opening or the anchor's cache cannot be extended (the caller then runs it whole)."""
    from transformers import DynamicCache

    from .anchor_prefix import replaying

    model = calm.anchor.model
    ids, mask = batch.anchor.input_ids.to(device), batch.anchor.attention_mask.to(device)
    positions = None if positions is None else positions.to(device)
    length, seen = opening_length(ids, mask, positions, condition, [batch.augments[k].input_ids for k, _, _ in condition],
                                  sliding_window(model))
    if not length:
        return None
    run = lambda i, m, c, p, cache: calm.anchor_logits(i, m, c, cache=cache, positions=p, hidden_only=hidden_only)
    try:
        return run_sharing_opening(run, ids, mask, condition, length, seen, positions,
                                   None if prefix is None else prefix.to(device), lambda s: replaying(calm, s),
                                   DynamicCache(config=model.config))
    except (TypeError, ValueError, NotImplementedError) as error:  # a model without an extendable cache
        log.info("the opening is not shared for %s: %s", type(model).__name__, error)
        return None


def sliding_window(model) -> int | None:
    """The model's sliding attention window, None where every layer attends to the whole text."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    return window if window and (not types or any("sliding" in t for t in types)) else None


def opening_length(anchor_ids: torch.Tensor, anchor_mask: torch.Tensor, positions: torch.Tensor | None,
                   condition, augment_ids: list[torch.Tensor], window: int | None = None) -> tuple[int, list[int]]:
    """(anchor tokens the batch can share, augmenting tokens each active model shares there); (0, []) when none.

    anchor_ids, anchor_mask: (B, T); positions: the (B, T) target mask (else no sharing); condition: (k, memory, visible
    (B, T, T_aug)) per active augmenting model, as anchor_logits takes it; augment_ids: model k's (B, T_aug) tokens."""
    rows, width = anchor_ids.shape
    if rows < 2 or positions is None or positions.dim() != 2 or (window is not None and width > window):
        return 0, []
    same = ((anchor_ids == anchor_ids[:1]) & anchor_mask.bool()).all(0)  # (T,) column agrees and is real in every row
    length = int(same.long().cumprod(0).sum())
    length = min(length, width - 1)  # every row keeps a token of its own
    targets = positions.any(0).nonzero()
    if len(targets):
        length = min(length, int(targets[0]))
    for _k, _memory, visible in condition:  # shorten to the positions that read the same augmenting tokens everywhere
        part = visible[:, :length]  # (B, L, T_aug)
        ids = augment_ids[_k].to(part.device)
        agreed = (ids == ids[:1]).all(0).long().cumprod(0).bool()  # (T_aug,) this column and all before agree
        good = (part == part[:1]).all(-1).all(0) & ~(part & ~agreed).any(-1).any(0)  # (L,)
        length = min(length, int(good.long().cumprod(0).sum()))
    if length < MIN_TOKENS:
        return 0, []
    seen = []
    for _k, _memory, visible in condition:
        columns = visible[:, :length].any(1).any(0).nonzero()
        seen.append(int(columns[-1]) + 1 if len(columns) else 0)
    return length, seen


def run_sharing_opening(run, anchor_ids, anchor_mask, condition, length: int, seen: list[int], positions,
                        prefix: torch.Tensor | None, replaying, cache):
    """The composed forward of `run` with the first `length` anchor tokens run once.

    run(ids, mask, condition, positions, cache): the anchor with the bridge (ComposedLM.anchor_logits);
    replaying(states): the context that replays the anchor's frozen prefix (None: no prefix, every layer runs);
    cache: an empty cache for the anchor. Returns what run returns for the rows' own tokens; with `positions`
    a (B, T) mask whose targets all lie after the opening, that is what the whole batch would give."""
    rows = anchor_ids.shape[0]
    opening_condition = [(k, [(keys[:1, :, :cut], values[:1, :, :cut]) for keys, values in memory],
                          visible[:1, :length, :cut]) for (k, memory, visible), cut in zip(condition, seen)]
    nothing = torch.zeros(1, length, dtype=torch.bool, device=anchor_ids.device)
    with replaying(prefix[:1, :length]) if prefix is not None else nullcontext():
        run(anchor_ids[:1, :length], anchor_mask[:1, :length], opening_condition, nothing, cache)
    _fill_skipped_layers(cache, length)
    cache.batch_repeat_interleave(rows)
    mask = torch.cat([torch.ones_like(anchor_mask[:, :length]), anchor_mask[:, length:]], 1)
    rest_condition = [(k, memory, visible[:, length:]) for k, memory, visible in condition]
    with replaying(prefix[:, length:]) if prefix is not None else nullcontext():
        return run(anchor_ids[:, length:], mask, rest_condition, positions[:, length:], cache)


def _fill_skipped_layers(cache, length: int) -> None:
    """Replayed layers write no keys or values, but the model reads the cache's length from its first layer: give
    them zeros of the opening's length (never read: those layers do not run)."""
    filled = next((layer for layer in cache.layers if layer.get_seq_length() > 0), None)
    if filled is None:
        raise ValueError("the anchor wrote nothing into its cache")
    for index, layer in enumerate(cache.layers):
        if layer.get_seq_length() == 0:
            zeros = torch.zeros_like(filled.keys.detach())
            cache.update(zeros, torch.zeros_like(filled.values.detach()), index)
        assert layer.get_seq_length() == length, "the opening's cache must cover the opening in every layer"
