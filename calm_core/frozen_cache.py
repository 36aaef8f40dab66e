"""What the frozen models compute for a training example, computed once and reused every epoch.

Two kinds of states depend on the text alone: the augmenting models' states at their composition
layers, and the anchor's states below the first layer the bridge writes into (anchor_prefix.py).
With both stored, a training step runs only the anchor above the bridge, the bridge and the loss.
States are computed in fixed-order chunks of rows, so their values never depend on which batch
first needed them (a resumed run matches an uninterrupted one).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .anchor_prefix import prefix_depth, prefix_states
from .batches import collate

CHUNK = 64  # rows computed together


def bytes_per_token(calm) -> int:
    """Stored float32 bytes per token, counting an anchor token and an augmenting token alike (an estimate)."""
    augment = sum(member.info.width * len(bridge.pairs) * 4 for member, bridge in zip(calm.augments, calm.bridge.augments))
    return augment + (calm.anchor.info.width * 4 if prefix_depth(calm) else 0)


def cache_bytes(calm, rows) -> int:
    """What storing every row's frozen states takes (float32)."""
    augment = sum(member.info.width * len(bridge.pairs) * 4 * sum(len(row.augment_ids[k]) for row in rows)
                  for k, (member, bridge) in enumerate(zip(calm.augments, calm.bridge.augments)))
    anchor = calm.anchor.info.width * 4 * sum(len(row.anchor_ids) for row in rows) if prefix_depth(calm) else 0
    return augment + anchor


class FrozenStates:
    """Per-chunk stored states of the training rows; batch() returns them for a list of row indices."""

    def __init__(self, calm, rows):
        self.calm, self.rows, self.chunks = calm, rows, {}
        self.with_prefix = prefix_depth(calm) > 0

    def _compute(self, start: int) -> dict:
        batch, _ = collate(self.calm, self.rows[start:start + CHUNK])
        augments = [[s.detach().float().cpu() for s in self.calm.augment_states(k, enc.input_ids, enc.attention_mask)]
                    for k, enc in enumerate(batch.augments)]
        prefix = None
        if self.with_prefix:
            prefix = prefix_states(self.calm, batch.anchor.input_ids, batch.anchor.attention_mask).float().cpu()
        return {"augments": augments, "prefix": prefix}

    def batch(self, indices: list[int]) -> tuple[list[list[torch.Tensor]], torch.Tensor | None]:
        """(augmenting states per model and composition layer, anchor prefix states or None), each
        row cut or zero-padded to this batch's longest (a chunk is padded to its own longest row)."""
        for start in sorted({i // CHUNK * CHUNK for i in indices}):
            if start not in self.chunks:
                self.chunks[start] = self._compute(start)
        part = lambda i: self.chunks[i // CHUNK * CHUNK]
        augments = []
        for k in range(len(self.calm.augments)):
            length = max(len(self.rows[i].augment_ids[k]) for i in indices)
            augments.append([_stack([part(i)["augments"][k][layer][i % CHUNK] for i in indices], length)
                             for layer in range(len(self.calm.bridge.augments[k].pairs))])
        prefix = None
        if self.with_prefix:
            length = max(len(self.rows[i].anchor_ids) for i in indices)
            prefix = _stack([part(i)["prefix"][i % CHUNK] for i in indices], length)
        return augments, prefix


def _stack(pieces: list[torch.Tensor], length: int) -> torch.Tensor:
    return torch.stack([F.pad(p[:length], (0, 0, 0, length - min(len(p), length))) for p in pieces])
