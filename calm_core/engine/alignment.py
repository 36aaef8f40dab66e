"""Aligning two tokenizations of one text so that cross-attention stays causal.

Every token gets a *key*, a character position. An anchor token may see an augmenting token
when the augmenting key is <= the anchor key:
  - an augmenting token's key is where its characters end (an upper bound, when in doubt);
  - an anchor token's key is how far into the text its own prefix is fully known (a lower
    bound, when in doubt): the end of its span, or the start of a character that a later byte
    piece completes.
With one shared tokenizer both sides read the same ids and the keys are token positions, so
this is the ordinary causal mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CALMError


@dataclass
class Encoding:
    """One tokenizer's view of a batch of texts, right-padded."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) bool
    keys: torch.Tensor  # (B, T) long, see the module docstring
    tokens: list[list[str]]  # readable token strings per row, padding excluded
    spans: list[list[tuple[int, int]]]  # character (start, end) per real token, as the tokenizer gives them


def pad_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def tokenize(tokenizer, texts: list[str], add_special_tokens: bool = True, max_length: int | None = None):
    """Ids, offsets and special-token masks per text (no padding); needs a fast tokenizer."""
    out = tokenizer(
        list(texts),
        add_special_tokens=add_special_tokens,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
        truncation=max_length is not None,
        max_length=max_length,
    )
    return out["input_ids"], out["offset_mapping"], out["special_tokens_mask"]


def anchor_keys(offsets, special) -> list[int]:
    ends = _running_max([e for _, e in offsets])
    keys = []
    next_start = None
    for i in range(len(offsets) - 1, -1, -1):
        key = ends[i] if next_start is None else min(ends[i], next_start)
        keys.append(key)
        s, e = offsets[i]
        if e > s and not special[i]:
            next_start = s
    keys.reverse()
    # Monotone from the right: a token never knows more than the token after it.
    for i in range(len(keys) - 2, -1, -1):
        keys[i] = min(keys[i], keys[i + 1])
    return keys


def augment_keys(offsets, special, text_length: int) -> list[int]:
    keys = []
    for i, (s, e) in enumerate(offsets):
        if e <= s and not special[i]:
            # An ordinary token with an empty span (byte-level BPE trims lone spaces): its
            # characters end no later than where the next real token starts.
            e = next((s2 for (s2, e2), sp in zip(offsets[i + 1:], special[i + 1:]) if e2 > s2 and not sp), text_length)
        keys.append(e)
    return _running_max(keys)


def _running_max(values: list[int]) -> list[int]:
    out, best = [], 0
    for v in values:
        best = max(best, v)
        out.append(best)
    return out


def display_tokens(tokenizer, text: str, ids, offsets) -> list[str]:
    pieces = tokenizer.convert_ids_to_tokens(list(ids))
    return [text[s:e] if e > s else piece for (s, e), piece in zip(offsets, pieces)]


def pad_rows(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def encode(tokenizer, texts: list[str], role: str, add_special_tokens: bool = True,
           max_length: int | None = None) -> Encoding:
    """Tokenize texts for the anchor (role="anchor") or an augmenting model (role="augment")."""
    ids, offsets, special = tokenize(tokenizer, texts, add_special_tokens, max_length)
    for row, text in zip(ids, texts):
        if len(row) == 0:
            raise CALMError(f"The text {text[:40]!r} gives no tokens; give some text to read.")
    if role == "anchor":
        keys = [anchor_keys(o, s) for o, s in zip(offsets, special)]
    else:
        keys = [augment_keys(o, s, len(t)) for o, s, t in zip(offsets, special, texts)]
    lengths = [len(r) for r in ids]
    mask = pad_rows([[1] * n for n in lengths], 0).bool()
    return Encoding(
        input_ids=pad_rows(ids, pad_id(tokenizer)),
        attention_mask=mask,
        keys=pad_rows(keys, 0),
        tokens=[display_tokens(tokenizer, t, i, o) for t, i, o in zip(texts, ids, offsets)],
        spans=[[tuple(o) for o in row] for row in offsets],
    )


def positional(encoding: Encoding) -> Encoding:
    """The same encoding with token positions as keys: the shared-tokenizer case."""
    B, T = encoding.input_ids.shape
    return Encoding(encoding.input_ids, encoding.attention_mask, torch.arange(T).expand(B, T), encoding.tokens, encoding.spans)


def visibility(anchor_keys: torch.Tensor, anchor_mask: torch.Tensor,
               augment_keys: torch.Tensor, augment_mask: torch.Tensor) -> torch.Tensor:
    """(B, T_anchor, T_augment) bool: which augmenting tokens each anchor token may attend to."""
    visible = augment_keys[:, None, :] <= anchor_keys[:, :, None]
    return visible & anchor_mask[:, :, None] & augment_mask[:, None, :]


def same_tokenizer(a, b) -> bool:
    """True when two tokenizers turn any text into the same ids (then no alignment is needed)."""
    if a is b:
        return True
    if type(a) is not type(b) or len(a) != len(b):
        return False
    if (a.bos_token_id, a.eos_token_id) != (b.bos_token_id, b.eos_token_id):
        return False
    probe = "Hello, world! 1+2=3 \u00e9\u4e2d  x\n"
    return a.get_vocab() == b.get_vocab() and a(probe)["input_ids"] == b(probe)["input_ids"]
