"""The tokens every training row opens with, run through a frozen model once.

Chat data repeats one opening in every row (SmolLM2's template puts its default system turn first: 24 of the
real preset's 62 anchor tokens a row, 39 of Gemma's 88). A causal model's states there depend on those tokens
alone, so the frozen-state cache (frozen_cache.py) computes them once, batch 1, keeps their keys and values,
and runs each chunk of rows from a copy of that cache on the rest: the same states as a whole-row forward, to
float rounding, for about a third less of the fill on the real preset.

Rows are padded on the right, so the opening sits at the same positions in every row. Not used where it could
change a result: an opening under MIN_TOKENS (not worth a second call), a sliding-window model whose rows are
longer than its window (the copied cache would have to drop keys a whole-row forward still reads), or a model
whose cache cannot be extended (the chunk is then run whole, as before).
"""
from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import DynamicCache

from ..engine.opening_forward import MIN_TOKENS, sliding_window

log = logging.getLogger(__name__)


# (ids (B, T), mask (B, T), cache or None) -> the states the cache stores, one (B, T, D) tensor per layer read
Run = Callable[..., list[torch.Tensor]]


def common_length(sequences: list[list[int]]) -> int:
    """Tokens every sequence opens with, leaving each at least one of its own (0 for no sequences)."""
    if not sequences:
        return 0
    shared = os.path.commonprefix(sequences)  # element-wise on lists, not only strings
    return max(0, min(len(shared), min(len(s) for s in sequences) - 1))


def usable_length(model, sequences: list[list[int]]) -> int:
    """The opening Opening.of computes for these rows: 0 where it is not used (see the module's note)."""
    length, window = common_length(sequences), sliding_window(model)
    if length < MIN_TOKENS or (window is not None and max(len(s) for s in sequences) > window):
        return 0
    return length


@dataclass
class Opening:
    length: int  # tokens
    opened: list[torch.Tensor]  # (1, length, D) per layer read: the opening's states
    cache: DynamicCache  # the model's keys and values over the opening, batch 1
    run: Run

    @classmethod
    def of(cls, model, sequences: list[list[int]], run: Run) -> "Opening | None":
        """The rows' shared opening through `model`, or None where it is not used (see the module's note)."""
        length = usable_length(model, sequences)
        if not length:
            return None
        cache = DynamicCache(config=model.config)
        ids = torch.tensor([sequences[0][:length]])
        try:
            states = run(ids, torch.ones_like(ids, dtype=torch.bool), cache=cache)
        except (TypeError, ValueError, NotImplementedError) as error:  # a model without an extendable cache
            log.info("shared opening not used for %s: %s", type(model).__name__, error)
            return None
        return cls(length, [s.detach() for s in states], cache, run)

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """(B, T, D) per layer for rows (B, T) that open with this opening: the rest run from a copy of its cache."""
        rows, cut = input_ids.shape[0], self.length
        cache = copy.deepcopy(self.cache)
        cache.batch_repeat_interleave(rows)
        mask = torch.cat([torch.ones(rows, cut, dtype=attention_mask.dtype), attention_mask[:, cut:]], 1)
        rest = self.run(input_ids[:, cut:], mask, cache=cache)
        return [torch.cat([opened.to(later.dtype).expand(rows, -1, -1), later], 1)
                for opened, later in zip(self.opened, rest)]
