"""The bridge: every trainable parameter of a composition (paper section 3.1).

One GatedCrossAttention per (anchor layer, augmenting layer) pair: project the augmenting
states to the anchor's width, cross-attend from the anchor states to them, and add the result
to the anchor's residual stream through a tanh gate that starts at 0 (so the composed model
starts exactly equal to the anchor).
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CALMError


class GatedCrossAttention(nn.Module):
    """Anchor layer j attends to the projected states of augmenting layer i."""

    def __init__(self, augment_width: int, anchor_width: int, num_heads: int, gate: str = "channel", norm: bool = True,
                 recency: int = 0, null_slot: bool = False, window: int = 0, relative: bool = False):
        super().__init__()
        if anchor_width % num_heads:
            raise CALMError(f"{num_heads} cross-attention heads do not divide the anchor width {anchor_width}.")
        self.num_heads, self.head_dim = num_heads, anchor_width // num_heads
        self.norm_augment = nn.LayerNorm(augment_width) if norm else nn.Identity()
        self.norm_anchor = nn.LayerNorm(anchor_width) if norm else nn.Identity()
        self.proj = nn.Linear(augment_width, anchor_width)  # f_proj: D_A -> D_B
        self.q = nn.Linear(anchor_width, anchor_width, bias=False)
        self.k = nn.Linear(anchor_width, anchor_width, bias=False)
        self.v = nn.Linear(anchor_width, anchor_width, bias=False)
        self.o = nn.Linear(anchor_width, anchor_width, bias=False)  # W^O
        self.gate_type = gate
        self.window = window  # 0: every visible augmenting state; W: only the W newest of them
        self.relative = relative  # the output is in units of the anchor state's RMS at its position
        # Gaussian noise on the augmenting states, std relative to each state's RMS: set only while the
        # bridge trains (noisy_augment_states), never at inference
        self.augment_noise, self.noise_generator = 0.0, None
        # attention bias by age: 0 for the newest visible augmenting token, 1 for the one before, ...
        self.recency = nn.Parameter(torch.zeros(num_heads, recency)) if recency else None
        # a learned key per head whose value is zero: attending to it writes nothing at that position
        self.null_key = nn.Parameter(torch.zeros(num_heads, self.head_dim)) if null_slot else None
        if gate == "channel":
            self.gate = nn.Parameter(torch.zeros(anchor_width))
        elif gate == "scalar":
            self.gate = nn.Parameter(torch.zeros(1))
        else:
            self.register_parameter("gate", None)

    def gate_values(self) -> torch.Tensor:
        """tanh(gate) per channel (one value for a scalar gate; 1 for the ungated residual)."""
        if self.gate is None:
            return torch.ones(1, device=self.o.weight.device)
        return torch.tanh(self.gate)

    def memory(self, augment_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, heads, T_aug, head_dim) from augmenting states (B, T_aug, D_A).
        Computed once per augmenting token; generation appends to them."""
        x = augment_states.to(self.proj.weight.dtype)
        if self.augment_noise:  # before any bridge parameter, so the bridge cannot learn to out-scale it
            rms = x.detach().pow(2).mean(-1, keepdim=True).sqrt()
            noise = torch.randn(x.shape, generator=self.noise_generator, device=x.device, dtype=x.dtype)
            x = x + self.augment_noise * rms * noise
        x = self.proj(self.norm_augment(x))
        return self._heads(self.k(x)), self._heads(self.v(x))

    def forward(self, anchor_states, memory, visible, scale: float = 1.0, record: list | None = None):
        """The gated contribution (B, T, D_B) to add to anchor_states (B, T, D_B).

        visible: (B, T, T_aug) bool. A row that may see nothing contributes exactly zero.
        record: when a list, the attention weights (B, heads, T, T_aug) are appended to it.
        """
        keys, values = memory
        dtype = anchor_states.dtype
        # age: visible augmenting tokens after this one (B, T, T_aug); 0 for the newest
        age = visible.flip(-1).cumsum(-1).flip(-1) - 1 if self.recency is not None or self.window else None
        if self.window:
            visible = visible & (age < self.window)
        q = self._heads(self.q(self.norm_anchor(anchor_states.to(self.q.weight.dtype))))
        # Masked entries get the most negative finite value, never -inf: rows that see nothing
        # stay finite (and are zeroed below), so neither outputs nor gradients can be NaN.
        bias = torch.zeros(visible.shape, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill(~visible, torch.finfo(q.dtype).min)[:, None]  # (B, 1, T, T_aug)
        if self.recency is not None:
            bucket = age.clamp(0, self.recency.shape[1] - 1)
            bias = bias + self.recency.to(q.dtype)[:, bucket].permute(1, 0, 2, 3) * visible[:, None]
        if self.null_key is not None:  # column 0: the null slot, visible from every row
            B, H, _, D = keys.shape
            keys = torch.cat([self.null_key.to(keys.dtype)[None, :, None].expand(B, H, 1, D), keys], 2)
            values = torch.cat([values.new_zeros(B, H, 1, D), values], 2)
            bias = torch.cat([bias.new_zeros(*bias.shape[:-1], 1), bias], -1)
        if record is None:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
        else:
            scores = q @ keys.transpose(-1, -2) / math.sqrt(self.head_dim) + bias
            real = visible.shape[-1]  # the augmenting states; a null slot (value zero) comes before them
            weights = scores.softmax(-1)[..., -real:] * visible[:, None]
            record.append(weights.detach().float().cpu())
            out = weights @ values[..., -real:, :]
        B, H, T, D = out.shape
        out = self.o(out.transpose(1, 2).reshape(B, T, H * D))
        out = out * visible.any(-1, keepdim=True)
        if self.relative:  # deep layers of real models have residual streams 10-100x larger than the first
            out = out * anchor_states.to(out.dtype).pow(2).mean(-1, keepdim=True).sqrt()
        if self.gate is not None:
            out = out * torch.tanh(self.gate)
        return (out * scale).to(dtype)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)


@contextmanager
def noisy_augment_states(blocks: list[GatedCrossAttention], std: float, generator: torch.Generator | None = None):
    """Inside the `with`, each composition block adds Gaussian noise (std relative to each state's RMS) to the
    augmenting states it reads. Input noise acts like ridge regression: a bridge trained on few distinct augmenting
    inputs (say, 40 keys) cannot key on low-signal directions that would not carry over to unseen inputs."""
    try:
        for block in blocks:
            block.augment_noise, block.noise_generator = std, generator
        yield
    finally:
        for block in blocks:
            block.augment_noise, block.noise_generator = 0.0, None


class AugmentBridge(nn.Module):
    """The composition blocks between the anchor and one augmenting model."""

    def __init__(self, pairs: list[tuple[int, int]], augment_width: int, anchor_width: int, num_heads: int,
                 gate: str, norm: bool, recency: int = 0, null_slot: bool = False, window: int = 0,
                 relative: bool = False):
        super().__init__()
        self.pairs = [tuple(p) for p in pairs]  # (anchor layer, augmenting layer), 0-based
        self.blocks = nn.ModuleList(
            GatedCrossAttention(augment_width, anchor_width, num_heads, gate, norm, recency, null_slot, window, relative)
            for _ in pairs
        )

    @property
    def augment_layers(self) -> list[int]:
        return [a for _, a in self.pairs]

    @property
    def anchor_layers(self) -> list[int]:
        return [b for b, _ in self.pairs]


class Bridge(nn.Module):
    """All trainable parameters of a composition: one AugmentBridge per augmenting model."""

    def __init__(self, augments: list[AugmentBridge]):
        super().__init__()
        self.augments = nn.ModuleList(augments)

    def blocks(self) -> list[GatedCrossAttention]:
        """Every composition layer, augmenting models in order: the indices used by gates(),
        layers_off() and attention recording."""
        return [block for bridge in self.augments for block in bridge.blocks]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
