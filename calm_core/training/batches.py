"""From examples to padded composed batches with loss targets, tokenized once up front."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine import alignment
from ..engine.alignment import Encoding
from ..engine.compose import ComposedBatch
from .data import Example


@dataclass
class Row:
    """One example as every model reads it. targets[i]: anchor token i is predicted (loss)."""

    anchor_ids: list[int]
    anchor_keys: list[int]
    targets: list[bool]
    augment_ids: list[list[int]]
    augment_keys: list[list[int]]
    keep_anchor: bool = False  # targets are the anchor alone's distribution (Example.keep_anchor)

    @property
    def num_targets(self) -> int:
        return sum(self.targets)


def context_length(model) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def prepare(calm, examples: list[Example], max_length: int | None = None, append_eos: bool = True,
            chunk: int = 512) -> tuple[list[Row], int]:
    """Rows for examples, and how many were truncated to the models' context."""
    limits = [x for x in (max_length, context_length(calm.anchor.model)) if x]
    anchor_limit = min(limits) if limits else None
    eos = calm.anchor.tokenizer.eos_token_id if append_eos else None
    rows, truncated = [], 0
    for start in range(0, len(examples), chunk):
        part = examples[start:start + chunk]
        texts = [e.prompt + e.completion for e in part]
        ids, offsets, special = alignment.tokenize(calm.anchor.tokenizer, texts)
        augment_views = []
        for member, shared in zip(calm.augments, calm.shared):
            if shared:
                augment_views.append(None)
            else:
                a_ids, a_off, a_special = alignment.tokenize(member.tokenizer, texts)
                limit = context_length(member.model)
                keys = [alignment.augment_keys(o, s, len(t)) for o, s, t in zip(a_off, a_special, texts)]
                augment_views.append((a_ids, keys, limit))
        for j, example in enumerate(part):
            row_ids, row_off, row_special = list(ids[j]), offsets[j], special[j]
            keys = alignment.anchor_keys(row_off, row_special)
            boundary = len(example.prompt)
            targets = [i > 0 and not row_special[i] and e > boundary for i, (_, e) in enumerate(row_off)]
            if eos is not None and (not row_ids or row_ids[-1] != eos):
                row_ids.append(eos)
                keys.append(len(texts[j]))
                targets.append(True)
            cut = False
            if anchor_limit is not None and len(row_ids) > anchor_limit:
                row_ids, keys, targets, cut = row_ids[:anchor_limit], keys[:anchor_limit], targets[:anchor_limit], True
            augment_ids, augment_keys = [], []
            for view in augment_views:
                if view is None:
                    augment_ids.append(row_ids)
                    augment_keys.append(list(range(len(row_ids))))
                    continue
                a_ids, a_keys, limit = view[0][j], view[1][j], view[2]
                if limit is not None and len(a_ids) > limit:
                    a_ids, a_keys, cut = a_ids[:limit], a_keys[:limit], True
                augment_ids.append(list(a_ids))
                augment_keys.append(list(a_keys))
            truncated += cut
            rows.append(Row(row_ids, keys, targets, augment_ids, augment_keys, example.keep_anchor))
    return rows, truncated


def _encoding(ids: list[list[int]], keys: list[list[int]], pad: int) -> Encoding:
    mask = alignment.pad_rows([[1] * len(r) for r in ids], 0).bool()
    return Encoding(alignment.pad_rows(ids, pad), mask, alignment.pad_rows(keys, 0), [[] for _ in ids], [[] for _ in ids])


def epoch_batch(rows: int, size: int, seed: int, step: int) -> list[int]:
    """The row indices of the global batch at `step`: epochs are seeded permutations read in order, a stateless
    function of (seed, step), so a resumed run sees exactly the batches an uninterrupted one would."""
    out, position = [], step * size
    while len(out) < size:
        epoch, offset = divmod(position, rows)
        order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
        take = min(size - len(out), rows - offset)
        out.extend(order[offset:offset + take].tolist())
        position += take
    return out


def collate(calm, rows: list[Row]) -> tuple[ComposedBatch, torch.Tensor]:
    """A padded ComposedBatch and labels (B, T) with -100 where no loss is taken."""
    anchor = _encoding([r.anchor_ids for r in rows], [r.anchor_keys for r in rows], alignment.pad_id(calm.anchor.tokenizer))
    augments = []
    for k, (member, shared) in enumerate(zip(calm.augments, calm.shared)):
        if shared:
            augments.append(alignment.positional(anchor))
        else:
            augments.append(_encoding([r.augment_ids[k] for r in rows], [r.augment_keys[k] for r in rows],
                                      alignment.pad_id(member.tokenizer)))
    labels = torch.full(anchor.input_ids.shape, -100, dtype=torch.long)
    for b, row in enumerate(rows):
        for i, is_target in enumerate(row.targets):
            if is_target:
                labels[b, i] = row.anchor_ids[i]
    return ComposedBatch([], anchor, augments), labels


def predicting_positions(labels: torch.Tensor) -> torch.Tensor:
    """The positions (sorted, 1-D) whose logits some row's loss needs: i where a label sits at i + 1. Prompts
    are most of a batch, and the output layer over a large vocabulary at every prompt position is about half of
    a training step on a small real anchor (49k words, SmolLM2); these are all it has to be applied to."""
    return (labels[:, 1:] != -100).any(0).nonzero().flatten()


def predicting_mask(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True at (b, i) where row b has a label at i + 1. Tighter than predicting_positions, whose
    union over rows still applies the output layer to every row at every row's answer positions (a batch with
    one 40-token rehearsal answer: 40 positions in all 16 rows); with the mask the model's logits are (N, V)."""
    mask = torch.zeros(labels.shape, dtype=torch.bool)
    mask[:, :-1] = labels[:, 1:] != -100
    return mask


def flat_predictions(logits: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor | None = None):
    """(logits (N, V), targets (N,), row of each (N,)) for the N target tokens, row by row, whichever form the
    logits come in: every position (positions None), (B, P, V) at 1-D positions, or (N, V) at a (B, T) mask."""
    labels = labels.to(logits.device)  # labels are built on the CPU; logits may be on a GPU
    if positions is not None and positions.dim() == 2:
        mask = positions.to(logits.device)
        shifted = torch.full_like(labels, -100)
        shifted[:, :-1] = labels[:, 1:]
        return logits, shifted[mask], mask.nonzero()[:, 0]
    if positions is None:
        logits, shifted = logits[:, :-1], labels[:, 1:]
    else:
        shifted = labels[:, positions.to(logits.device) + 1]
    keep = shifted != -100
    return logits[keep], shifted[keep], keep.nonzero()[:, 0]


def token_losses(logits: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy (N,) of each target token, row by row; logits at i predict the label at i + 1.
    positions: the logits are (B, len(positions), V) at those positions only (predicting_positions), or
    (N, V) at a (B, T) mask (predicting_mask)."""
    flat, targets, _ = flat_predictions(logits, labels, positions)
    return torch.nn.functional.cross_entropy(flat.float(), targets, reduction="none")


def length_groups(lengths: list[int], overhead: int = 96) -> list[list[int]]:
    """Split a batch's rows (by index) into groups of similar length, the cheapest way to run them.

    A padded batch costs rows x longest row; a group costs `overhead` tokens more (one more pass of the
    model's Python, and the rows' shared opening run once more: engine/opening_forward.py; on the real preset 96
    made a step 1.77 -> 1.59 s against 32, three interleaved rounds of 8 steps). Rehearsal rows carry 40-token answers beside 4-token ones, so one long row pads a batch
    of short ones to nearly twice their work; run apart, the gradient is the same sum (the trainer divides by
    the batch's target tokens), only cheaper. Optimal over contiguous runs of the sorted lengths (O(n^2))."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    sorted_lengths = [lengths[i] for i in order]
    best, cut = [0.0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):  # best[end]: cheapest cost of the first `end` sorted rows
        for start in range(end):
            cost = best[start] + (end - start) * sorted_lengths[end - 1] + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(order)
    while end:
        groups.append(sorted(order[cut[end]:end]))
        end = cut[end]
    return groups[::-1]
