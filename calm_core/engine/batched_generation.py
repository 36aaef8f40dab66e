"""Composed generation of many prompts at once: one forward of each model per step for the batch.

Equal, row by row, to decoding each prompt alone (generation.py), by construction:
- the anchor reads the prompts padded on the left, each row at its own positions (position_ids),
  so every row gets one new column per step and padding is never attended to;
- an augmenting model with its own tokenizer re-tokenizes each row's text every step, as alone.
  Its cache is a grid of columns: a step appends, per row, the tokens that are new for that row,
  padded to the batch's longest (masked columns between them are never attended to, and the
  bridge's visibility keys are per token, not per column). Where a row's tokenization of older
  text changed, the grid is cut back to the first such column for all rows and the rest re-read;
- where a changed augmenting token was visible to an anchor position already cached, the anchor
  recomputes from that column (for all rows: the others recompute what they had).
A sliding-window augmenting model counts its window in columns, so batching stays exact only while
the grid is narrower than the window; a batch that would outgrow it is decoded one prompt at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import CALMError
from . import alignment
from .generation import (
    GenerationResult,
    IncrementalText,
    Sampling,
    _common_prefix,
    _max_positions,
    augment_view,
    crop_cache,
    eos_ids,
    first_stale,
    new_cache,
    pick_next,
    render_prompt,
)


@dataclass
class _Row:
    prompt: str
    ids: list[int]  # anchor tokens: prompt, then generated
    keys: list[int]  # their alignment keys (alignment.anchor_keys)
    text: IncrementalText
    generator: torch.Generator | None
    new_ids: list[int] = field(default_factory=list)
    scores: list[torch.Tensor] = field(default_factory=list)
    finished: bool = False


class _WindowExceeded(Exception):
    """A sliding-window augmenting model's grid reached its window: batching would no longer be exact."""


def sliding_window(model) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(config, "sliding_window", None) or None


class _AugmentGrid:
    """One augmenting model's view of the batch: per row its tokens, their keys and columns."""

    def __init__(self, rows: int, config):
        self.ids = [[] for _ in range(rows)]
        self.keys = [[] for _ in range(rows)]
        self.cols = [[] for _ in range(rows)]  # column of each token
        self.width = 0  # columns in the cache and memory
        self.config = config
        self.cache = new_cache(config)
        self.memory = None  # per block (keys, values) (B, heads, width, head_dim)

    def cut(self, column: int) -> None:
        """Forget every column from `column` on, for all rows."""
        if column >= self.width:
            return
        if not crop_cache(self.cache, column):  # a sliding window dropped what is needed: read all again
            self.cache, column = new_cache(self.config), 0
        self.memory = [(k[:, :, :column], v[:, :, :column]) for k, v in self.memory] if column else None
        for r in range(len(self.ids)):
            n = sum(c < column for c in self.cols[r])
            self.ids[r], self.keys[r], self.cols[r] = self.ids[r][:n], self.keys[r][:n], self.cols[r][:n]
        self.width = column

    def key_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, mask), each (B, width): holes between rows' chunks are masked."""
        keys = torch.zeros(len(self.ids), self.width, dtype=torch.long)
        mask = torch.zeros(len(self.ids), self.width, dtype=torch.bool)
        for r, (row_keys, row_cols) in enumerate(zip(self.keys, self.cols)):
            if row_cols:
                keys[r, row_cols], mask[r, row_cols] = torch.tensor(row_keys), True
        return keys, mask


class BatchDecoder:
    """The state of a batched composed generation; step() returns the next logits of every row."""

    def __init__(self, calm, texts: list[str], add_special: list[bool], sampling: Sampling, scales: list[float]):
        self.calm, self.scales = calm, scales
        tokenizer = calm.anchor.tokenizer
        self.rows = []
        for text, special in zip(texts, add_special):
            ids, offsets, specials = alignment.tokenize(tokenizer, [text], special)
            if not ids[0]:
                raise CALMError("A prompt gives no tokens; write a prompt (or use a tokenizer that adds BOS).")
            generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
            self.rows.append(_Row(text, list(ids[0]), alignment.anchor_keys(offsets[0], specials[0]),
                                  IncrementalText(tokenizer, list(ids[0])), generator))
        self.lead = max(len(r.ids) for r in self.rows)
        self.offsets = [self.lead - len(r.ids) for r in self.rows]  # left padding of each row
        self.pad = alignment.pad_id(tokenizer)
        self.active = [k for k in range(len(calm.augments)) if any(scales[i] for i in calm._block_range(k))]
        self.grids = {k: _AugmentGrid(len(self.rows), calm.augments[k].model.config) for k in self.active}
        self.cache = new_cache(calm.anchor.model.config)
        self.columns = [[(self.pad, False)] * off + [(i, True) for i in r.ids] for r, off in zip(self.rows, self.offsets)]
        self.done = 0  # anchor columns in the cache

    # ---- one step -----------------------------------------------------------------------------

    def append(self, row: int, token: int | None) -> str:
        """Add a token to a row (None: the row has finished and gets a masked column)."""
        r = self.rows[row]
        if token is None:
            self.columns[row].append((self.pad, False))
            return ""
        piece = r.text.push(token)
        r.ids.append(token)
        r.keys.append(len(r.prompt) + len(r.text.stable()))
        self.columns[row].append((token, True))
        return piece

    def _read_augment(self, k: int, views) -> int:
        """Bring augmenting model k up to date; returns the first anchor column to recompute."""
        grid, calm, restart = self.grids[k], self.calm, self.done
        cut = grid.width
        for row, (ids, keys, anchor_keys) in enumerate(views):
            keep = _common_prefix(grid.ids[row], ids)
            if keep < len(grid.ids[row]):
                cut = min(cut, grid.cols[row][keep])
                cached = min(self.done - self.offsets[row], len(anchor_keys))  # this row's anchor tokens in the cache
                restart = min(restart, self.offsets[row] + first_stale(grid.keys[row], keys, keep, anchor_keys, cached))
        grid.cut(cut)
        feeds = [ids[len(grid.ids[row]):] for row, (ids, _, _) in enumerate(views)]
        width = max(len(f) for f in feeds)
        if width == 0:
            return restart
        window = sliding_window(calm.augments[k].model)
        if window is not None and grid.width + width >= window:
            raise _WindowExceeded
        device = calm.anchor.model.device
        _, old_mask = grid.key_tensors()
        chunk = torch.full((len(feeds), width), alignment.pad_id(calm.augments[k].tokenizer), dtype=torch.long)
        positions = torch.zeros(len(feeds), width, dtype=torch.long)
        new_mask = torch.zeros(len(feeds), width, dtype=torch.bool)
        for row, (feed, (_, keys, _)) in enumerate(zip(feeds, views)):
            if feed:  # right-aligned in the chunk
                start = len(grid.ids[row])
                chunk[row, width - len(feed):] = torch.tensor(feed)
                positions[row, width - len(feed):] = torch.arange(start, start + len(feed))
                new_mask[row, width - len(feed):] = True
                grid.cols[row] += list(range(grid.width + width - len(feed), grid.width + width))
                grid.ids[row] = grid.ids[row] + feed
                grid.keys[row] = grid.keys[row] + list(keys[start:start + len(feed)])
        mask = torch.cat([old_mask, new_mask], 1)
        states = calm.augment_states(k, chunk, mask, cache=grid.cache, position_ids=positions)
        memory = [block.memory(s.to(device)) for block, s in zip(calm.bridge.augments[k].blocks, states)]
        if grid.memory is not None:
            memory = [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)) for (k0, v0), (k1, v1) in zip(grid.memory, memory)]
        grid.memory, grid.width = memory, grid.width + width
        return restart

    def step(self) -> torch.Tensor:
        """Anchor logits (B, vocab) for the token after every row's text so far."""
        calm, device = self.calm, self.calm.anchor.model.device
        start, views = self.done, {}
        for k in self.active:
            views[k] = [augment_view(calm, k, r.prompt, r.text, r.ids, r.keys) for r in self.rows]
            start = min(start, self._read_augment(k, views[k]))
        if not crop_cache(self.cache, start):
            self.cache, start = new_cache(calm.anchor.model.config), 0
        width = len(self.columns[0])
        ids = torch.tensor([[c[0] for c in row[start:]] for row in self.columns], device=device)
        mask = torch.tensor([[c[1] for c in row] for row in self.columns])
        # position of each column within its own row: real tokens count from 0 after the left padding
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)[:, start:]
        condition = []
        for k in self.active:
            anchor_keys = torch.zeros(len(self.rows), width - start, dtype=torch.long)
            for row, (_, _, keys) in enumerate(views[k]):
                for column in range(start, width):  # real token i of a row sits in column offset + i
                    i = column - self.offsets[row]
                    if 0 <= i < len(keys):
                        anchor_keys[row, column - start] = keys[i]
            grid_keys, grid_mask = self.grids[k].key_tensors()
            visible = alignment.visibility(anchor_keys, mask[:, start:], grid_keys, grid_mask)
            condition.append((k, self.grids[k].memory, visible.to(device)))
        with torch.no_grad():
            logits = calm.anchor_logits(ids, mask.to(device), condition, cache=self.cache, scales=self.scales,
                                        position_ids=positions.to(device), last_only=True)
        self.done = width
        return logits[:, -1]


def _window_safe(calm, texts: list[str], max_new_tokens: int) -> bool:
    """False when a sliding-window augmenting model's grid would plainly outgrow its window."""
    for member in calm.augments:
        window = sliding_window(member.model)
        if window and max(len(member.tokenizer(t)["input_ids"]) for t in texts) + 2 * max_new_tokens >= window:
            return False
    return True


def is_batch(prompt) -> bool:
    """A list of prompts (strings or chat message lists), as opposed to one prompt or one chat."""
    return (isinstance(prompt, (list, tuple)) and len(prompt) > 0
            and all(isinstance(p, str) or (isinstance(p, (list, tuple)) and not isinstance(p, str)) for p in prompt))


def generate_batch(calm, prompts: list, max_new_tokens: int = 32, return_dict: bool = False, scales=None,
                   **kwargs) -> list:
    """Texts (or GenerationResults) for a list of prompts, each as generate() would give it alone."""
    from .generation import generate

    sampling = Sampling(**kwargs)
    scales = scales if scales is not None else calm.block_scales(decoding=True)
    rendered = [render_prompt(calm.anchor.tokenizer, p) for p in prompts]
    if not sampling.use_cache or len(prompts) == 1 or not _window_safe(calm, [t for t, _ in rendered], max_new_tokens):
        return [generate(calm, p, max_new_tokens, return_dict, scales=scales, **kwargs) for p in prompts]
    try:
        return _decode(calm, rendered, max_new_tokens, return_dict, sampling, scales)
    except _WindowExceeded:  # rare: start again, one prompt at a time
        return [generate(calm, p, max_new_tokens, return_dict, scales=scales, **kwargs) for p in prompts]


def _decode(calm, rendered, max_new_tokens: int, return_dict: bool, sampling: Sampling, scales) -> list:
    decoder = BatchDecoder(calm, [t for t, _ in rendered], [s for _, s in rendered], sampling, scales)
    stop, limit = eos_ids(calm), _max_positions(calm.anchor.model)
    pieces = [[] for _ in rendered]
    for _ in range(max_new_tokens):
        for r in decoder.rows:
            if limit is not None and len(r.ids) >= limit:
                r.finished = True
        if all(r.finished for r in decoder.rows):
            break
        logits = decoder.step()
        for row, r in enumerate(decoder.rows):
            token = None
            if not r.finished:
                if return_dict:
                    r.scores.append(logits[row].detach().float().cpu())
                token = pick_next(logits[row], sampling, r.generator)
                if token in stop:
                    r.finished, token = True, None
                else:
                    r.new_ids.append(token)
            pieces[row].append(decoder.append(row, token))
    texts = ["".join(p) + r.text.flush() for p, r in zip(pieces, decoder.rows)]
    if not return_dict:
        return texts
    return [GenerationResult(t, r.new_ids, r.scores) for t, r in zip(texts, decoder.rows)]
