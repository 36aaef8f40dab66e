"""Rows trained toward the anchor alone (Example.keep_anchor): KL(anchor alone || composition) at their targets.

Rehearsal rows teach a bridge to leave the anchor as it was where the augmenting model has nothing to add.
Cross-entropy on the anchor's own greedy answer says that only about one word per position; the KL keeps the
anchor's whole next-token distribution (on the real pair: general-prompt perplexity ratio 1.90 -> 1.11,
demos/real_knowledge/README.md). The reference is the same composition with every gate scaled to 0, which is the
anchor exactly; it depends on the text alone, so the trainer stores it with the other frozen states
(frozen_cache.py) or, with the cache off, computes it here without grad.
"""
from __future__ import annotations

import torch

from .batches import collate, flat_predictions
from .fused_loss import cross_entropy_losses, linear_cross_entropy


def anchor_kl_losses(logits: torch.Tensor, reference: torch.Tensor, labels: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
    """KL(reference || composition) (N,) at each target token, row by row, in token_losses' order.
    logits, reference: the composition's and the anchor alone's, in the same form (batches.flat_predictions)."""
    flat, _, _ = flat_predictions(logits, labels, positions)
    flat_reference, _, _ = flat_predictions(reference, labels, positions)
    return kl_to_reference(torch.log_softmax(flat_reference.float(), -1), flat)


def kl_to_reference(log_q: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(q || softmax(logits)) (N,) for reference log-probabilities log_q (N, V) and logits (N, V)."""
    log_p = torch.log_softmax(logits.float(), -1)
    log_q = log_q.to(log_p.device).float()
    return (log_q.exp() * (log_q - log_p)).sum(-1)


def kept_row_losses(calm, rows, kept: list[int], logits, labels, positions, prefix=None, references=None,
                    bf16: bool = False, output=None) -> torch.Tensor:
    """KL losses (N,) of the rows `kept` (sorted indices into the batch), row by row.
    references: their stored (targets, V) log-probabilities (FrozenStates.references); None: run the anchor.
    output: the anchor's output layer when `logits` are the final hidden states (N, D) (fused_loss.py)."""
    flat, _, row_of = flat_predictions(logits, labels, positions)
    mine = flat[torch.isin(row_of, torch.tensor(kept, device=row_of.device))]  # kept rows' tokens, row by row
    if output is not None:
        mine = output(mine)
    if references is not None:
        return kl_to_reference(torch.cat(references), mine)
    sub_batch, sub_labels = collate(calm, [rows[b] for b in kept])
    width = sub_labels.shape[1]
    if positions.dim() == 2:  # these rows' mask; their targets all lie within their own width
        sub_positions = positions[kept][:, :width]
    else:  # the batch's positions, clipped to these rows' width: a clipped position predicts no target of theirs
        sub_positions = positions.clamp(max=width - 1)
    sub_prefix = None if prefix is None else prefix[kept][:, :width]
    device_type = logits.device.type
    with torch.no_grad(), calm.gate_scale(0.0), torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
        reference = calm.forward(sub_batch, anchor_prefix=sub_prefix, positions=sub_positions)
    if positions.dim() != 2:
        padded = torch.full((len(kept), labels.shape[1]), -100, dtype=labels.dtype)
        padded[:, :width] = sub_labels
        reference, _, _ = flat_predictions(reference, padded, positions)
    return kl_to_reference(torch.log_softmax(reference.float(), -1), mine)


def row_losses(calm, rows, logits, labels, positions, prefix=None, references=None, bf16: bool = False,
               output=None) -> torch.Tensor:
    """Per-token losses of a batch (N,): cross-entropy on text rows' targets, then KL to the anchor alone on
    keep_anchor rows' targets (references: as kept_row_losses). output: the anchor's output layer when `logits`
    are the final hidden states at a (B, T) mask of positions: the cross-entropy is taken chunked (fused_loss.py)."""
    kept = [b for b, row in enumerate(rows) if row.keep_anchor]
    if not kept:
        return cross_entropy_losses(logits, labels, positions, output)
    flat, targets, row_of = flat_predictions(logits, labels, positions)
    text = ~torch.isin(row_of, torch.tensor(kept, device=row_of.device))
    if output is not None:
        text_losses = linear_cross_entropy(flat[text], output, targets[text])
    else:
        text_losses = torch.nn.functional.cross_entropy(flat[text].float(), targets[text], reduction="none")
    return torch.cat([text_losses, kept_row_losses(calm, rows, kept, logits, labels, positions, prefix, references,
                                                   bf16, output)])
