"""Looking inside a composition: gates, per-layer switches, a gate scale and recorded cross-attention.

Each setting applies to the calling thread only (ComposedLM keeps them in a threading.local), so a training
thread and a chat in another thread never see each other's settings; each is set in a context manager and
restored in `finally`."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..errors import CALMError


@dataclass
class AttentionRecord:
    """Cross-attention weights of the most recent forward pass inside record_attention()."""

    maps: list  # per composition layer: (batch, heads, anchor tokens, augment tokens) or None
    anchor_tokens: list[str]
    augment_tokens: list[str]  # of the first augmenting model
    augment_tokens_by_model: list[list[str]]
    layer_pairs: list[tuple[int, int, int]]  # (augment index, anchor layer, augment layer)



class Inspection:
    """Mixed into ComposedLM, which provides `bridge` and `_local` (a threading.local)."""

    _gate_scale = property(lambda self: getattr(self._local, "gate_scale", 1.0))
    _layers_off = property(lambda self: getattr(self._local, "layers_off", frozenset()))
    _recorder = property(lambda self: getattr(self._local, "recorder", None))

    def _block_range(self, k: int) -> range:
        start = sum(len(b.blocks) for b in self.bridge.augments[:k])
        return range(start, start + len(self.bridge.augments[k].blocks))

    def block_scales(self, decoding: bool = False) -> list[float]:
        """The factor on each composition layer's contribution: gate_scale, 0 where switched off. decoding: 0 also
        where the layer's gate is exactly closed, as a fresh bridge's are: it adds exactly nothing, so generation
        skips it, and runs no augmenting model whose layers are all skipped (a closed bridge decodes at the anchor's
        speed). Not while training (a closed gate still has a gradient) or recording attention."""
        scales = [0.0 if i in self._layers_off else self._gate_scale for i in range(len(self.bridge.blocks()))]
        if decoding and self._recorder is None:
            scales = [0.0 if block.gate is not None and not bool(block.gate.detach().any()) else scale
                      for scale, block in zip(scales, self.bridge.blocks())]
        return scales

    def gates(self) -> list[torch.Tensor]:
        """tanh(gate) per composition layer (augmenting models in order), detached."""
        return [block.gate_values().detach().cpu() for block in self.bridge.blocks()]

    def layer_pairs(self) -> list[tuple[int, int, int]]:
        """(augment index, anchor layer, augmenting layer) per composition layer."""
        return [(k, b, a) for k, bridge in enumerate(self.bridge.augments) for b, a in bridge.pairs]

    @contextmanager
    def gate_scale(self, alpha: float):
        """Scale every bridge contribution by alpha: 0 is the anchor alone, exactly; >1 exaggerates."""
        previous, self._local.gate_scale = self._gate_scale, float(alpha)
        try:
            yield self
        finally:
            self._local.gate_scale = previous

    @contextmanager
    def layers_off(self, indices):
        """Switch the given composition layers (indices into gates()) off."""
        n = len(self.bridge.blocks())
        indices = frozenset(int(i) for i in indices)
        bad = sorted(i for i in indices if not 0 <= i < n)
        if bad:
            raise CALMError(f"Composition layers {bad} do not exist; this bridge has {n} (0..{n - 1}).")
        previous, self._local.layers_off = self._layers_off, self._layers_off | indices
        try:
            yield self
        finally:
            self._local.layers_off = previous

    @contextmanager
    def record_attention(self):
        """Record cross-attention weights per composition layer and head (see AttentionRecord)."""
        record = AttentionRecord([None] * len(self.bridge.blocks()), [], [], [], self.layer_pairs())
        previous, self._local.recorder = self._recorder, record
        try:
            yield record
        finally:
            self._local.recorder = previous
