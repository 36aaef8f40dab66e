"""What a piece of work will take in memory, checked before it starts, so that no session can take
the whole process (and every other session) down.

Estimates are generous on purpose: float32 activations kept for the backward pass, logits and
their gradients in float32, attention scores. A process-wide ledger holds what running work has
reserved, so two sessions cannot both be promised the same free gigabytes."""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import torch

from ..errors import CALMError
from ..models.devices import fast_bf16

GB = 2**30
# the share of the memory free at the time that one piece of work may take
SHARE = float(os.environ.get("CALM_MEMORY_SHARE", "0.6"))


def bf16_label() -> str:
    """The Train tab's precision checkbox, saying what bf16 does on this machine."""
    if fast_bf16("cpu"):
        return "bfloat16 steps (this CPU has native bfloat16: faster, half the memory)"
    return "bfloat16 steps (faster on a GPU; this CPU has no native bfloat16, so slower than float32 on it)"


def device_of_calm(calm) -> torch.device:
    return next(calm.anchor.model.parameters()).device


def available_bytes(device: torch.device | str | None = None) -> int:
    """Free memory where the work will run: the GPU's when it runs there, else the machine's."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


class MemoryLedger:
    """Reservations of running work; a new piece of work must fit beside them."""

    def __init__(self):
        self._lock, self._reserved = threading.Lock(), {}

    @property
    def reserved(self) -> int:
        return sum(self._reserved.values())

    def room(self, device=None) -> int:
        """Bytes one new piece of work may take now."""
        return max(0, int(SHARE * (available_bytes(device) - self.reserved)))

    @contextmanager
    def reserve(self, need: int, what: str, fix: str, device=None):
        """Hold `need` bytes for the duration of the block, or refuse with a message that says
        what it would take, what is free, and what to change."""
        with self._lock:
            room = self.room(device)
            if need > room:
                raise CALMError(f"{what} would need about {_gb(need)} of memory, but only {_gb(room)} is free for it "
                                f"now (other sessions share this machine). {fix}")
            token = object()
            self._reserved[token] = need
        try:
            yield
        finally:
            with self._lock:
                self._reserved.pop(token, None)


LEDGER = MemoryLedger()


def _gb(n: int) -> str:
    return f"{n / GB:.2f} GB" if n >= GB / 10 else f"{n / 2**20:.0f} MB"


def _element_bytes(calm) -> int:
    return next(calm.anchor.model.parameters()).element_size()


def _model_activation_bytes(member, tokens: int, element: int, backward: bool, scores: bool = True) -> int:
    """Per sequence of `tokens`: hidden states, MLP and attention scores of every layer, kept for
    the backward pass (training) or transient (one layer at a time, inference). Calibrated on the
    key-value preset (4x128): batch 1024 of 24 tokens grew the process by 2.5 GB; this says 3.8.
    scores False: attention that never holds the (tokens x tokens) scores (sdpa at inference)."""
    info = member.info
    per_layer = tokens * info.width * 48 * element + (info.num_heads * tokens * tokens * 4 * 3 if scores else 0)
    return per_layer * (info.num_layers if backward else 2)


def training_bytes(calm, batch_size: int, tokens: int, cached: bool = False) -> int:
    """One training step on `batch_size` sequences of `tokens` anchor tokens. `cached`: with the frozen-state cache
    on, where a step runs neither augmenting model and only the anchor's layers from the bridge's first up (the
    prefix below is stored: anchor_prefix.py). The loss goes through the output layer in chunks where it can
    (fused_loss.py): then the logits are a fixed few rows, not every token's."""
    from ..engine.anchor_prefix import prefix_depth
    from ..training.fused_loss import CHUNK, plain_output_layer

    element, info = _element_bytes(calm), calm.anchor.info
    per_layer = _model_activation_bytes(calm.anchor, tokens, element, backward=True) // info.num_layers
    per_sequence = per_layer * (info.num_layers - (prefix_depth(calm) if cached else 0))
    if not cached:
        per_sequence += sum(_model_activation_bytes(m, tokens, element, backward=False) for m in calm.augments)
    heads = calm.config.num_heads or info.num_heads
    for member, bridge in zip(calm.augments, calm.bridge.augments):  # each block: projections, scores, gated add
        per_block = tokens * (8 * info.width + 2 * member.info.width) * 4 + heads * tokens * tokens * 4 * 3
        per_sequence += per_block * len(bridge.pairs)
    logits = info.vocab_size * 4 * 4  # per row: logits, float copy, softmax, gradient
    fused = hasattr(calm, "_anchor_model") and plain_output_layer(calm._anchor_model()) is not None
    per_sequence += 0 if fused else tokens * logits
    bridge = sum(p.numel() for p in calm.bridge.parameters()) * 4 * 4  # weights, gradient, two Adam moments
    return batch_size * per_sequence + bridge + (min(CHUNK, batch_size * tokens) * logits if fused else 0)


def max_batch_size(calm, tokens: int, room: int) -> int:
    """The largest batch of `tokens`-long sequences whose training step fits in `room` bytes."""
    one = training_bytes(calm, 1, tokens)
    return max(0, (room - training_bytes(calm, 0, tokens)) // max(1, one - training_bytes(calm, 0, tokens)))


def generation_bytes(calm, tokens: int, models: int = 3) -> int:
    """Greedy generation up to `tokens` in total by the composition and each model alone (`models` answers, streamed
    in turn in one thread): every answer's KV caches at once, and the largest prompt's transient activations (one
    prefill at a time), the bridge's attention bias and the newest position's logits. Logits are made for the last
    position only (compose.anchor_logits last_only; transformers' generate keeps one) and attention scores count only
    where the attention is eager: counting every prompt position's logits, sdpa's scores and every answer's
    activations at once put a 2,400-token prompt to the real pair at 28 GB and a 5,400-token one at 39 GB, where the
    process grew by 1.9 and 4.3 GB (measured); this says 2.7 and 7.2."""
    element = _element_bytes(calm)
    caches, transient = 0, 0
    for member in [calm.anchor] + calm.augments:
        info = member.info
        caches += 2 * info.num_layers * tokens * info.width * element
        eager = getattr(member.model.config, "_attn_implementation", "eager") not in ("sdpa", "flash_attention_2")
        transient = max(transient, _model_activation_bytes(member, tokens, element, backward=False, scores=eager)
                        + info.vocab_size * 4 * 2)
    heads = calm.config.num_heads or calm.anchor.info.num_heads
    return caches * models + transient + heads * tokens * tokens * 4 * 2  # the bias: one bridge block at a time


def attention_map_bytes(calm, anchor_tokens: int, augment_tokens: int) -> int:
    """One forward pass that records every composition layer's attention weights."""
    heads = calm.config.num_heads or calm.anchor.info.num_heads
    maps = len(calm.bridge.blocks()) * heads * anchor_tokens * augment_tokens * 4 * 2
    return maps + generation_bytes(calm, max(anchor_tokens, augment_tokens), models=1)


# bytes held while reading a data file, per byte of the file: Arrow columns for CSV / Parquet /
# text (and the reader's buffers); Python dicts and strings for JSON and JSON Lines
# measured: a 40 MB CSV of short rows kept 240 MB; a 20 MB JSON Lines file of short rows peaked at 15.7x its size
READ_FACTOR = {".csv": 8, ".parquet": 8, ".txt": 8, ".jsonl": 20, ".json": 22}


def data_bytes(path) -> int:
    from pathlib import Path

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        return 0
    return size * READ_FACTOR.get(p.suffix.lower(), 22)


def frozen_cache_bytes(calm, config, examples: int, tokens: int, kept: int = 0) -> int:
    """At most what the trainer's frozen-state cache can take: its budget, or every example at the longest
    (and, for the `kept` keep_anchor examples, the anchor's log-probabilities over its vocabulary per token)."""
    from ..training.trainer import PREPARE_ALL

    if not config.cache_augment_states or examples > PREPARE_ALL:
        return 0
    from ..training.frozen_cache import bytes_per_token, references_bytes

    references = references_bytes(calm, kept * tokens, 2 if config.bf16 else 4)
    return int(min(config.cache_budget_mb * 2**20, examples * tokens * bytes_per_token(calm) + references))
