"""Composed generation with KV caches for the anchor and every augmenting model.

Each step feeds the anchor only its new token. Each augmenting model re-reads the text only
where its own tokenization changed: with a different tokenizer the text is re-tokenized, the
cache is kept up to the longest unchanged token prefix and only the rest is run. If a changed
augmenting token was visible to an anchor position already cached, the anchor recomputes from
that position, so cached and uncached generation agree exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from ..errors import CALMError
from . import alignment

CONTEXT_TOKENS = 4  # prompt tokens decoded with the new ones, so leading spaces come out right


@dataclass
class Sampling:
    """How the next token is chosen. do_sample=False is greedy."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    use_cache: bool = True

    def __post_init__(self):
        if self.temperature <= 0:
            raise CALMError(f"temperature must be > 0, got {self.temperature}; use do_sample=False for greedy.")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise CALMError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k is not None and self.top_k < 1:
            raise CALMError(f"top_k must be >= 1, got {self.top_k}.")


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    scores: list[torch.Tensor] = field(default_factory=list)  # anchor logits (vocab,) per step


def pick_next(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    logits = logits.float().cpu()
    if not sampling.do_sample:
        return int(logits.argmax())
    logits = logits / sampling.temperature
    if sampling.top_k is not None:
        kth = torch.topk(logits, min(sampling.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1:
        sorted_logits, order = logits.sort(descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= sampling.top_p  # keep the first token always
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return int(torch.multinomial(logits.softmax(-1), 1, generator=generator))


class IncrementalText:
    """Decodes generated ids piece by piece, holding back bytes of an unfinished character."""

    def __init__(self, tokenizer, context_ids: list[int]):
        self.tokenizer, self.context, self.ids, self.emitted = tokenizer, list(context_ids[-CONTEXT_TOKENS:]), [], 0
        self._base = self._decode(self.context)

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def full(self) -> str:
        text = self._decode(self.context + self.ids)
        return text[len(self._base):] if text.startswith(self._base) else self._decode(self.ids)

    def stable(self) -> str:
        """The text so far without a trailing incomplete character."""
        return self.full().rstrip("\ufffd")

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.stable()
        piece, self.emitted = text[self.emitted:], max(self.emitted, len(text))
        return piece

    def flush(self) -> str:
        text = self.full()
        piece, self.emitted = text[self.emitted:], len(text)
        return piece


class _AugmentTrack:
    """What one augmenting model has read so far: its ids, keys, KV cache and bridge memory."""

    def __init__(self):
        self.ids: list[int] = []
        self.keys: list[int] = []
        self.cache = None
        self.memory: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def crop(self, n: int) -> int:
        """Keep the first n tokens; returns how many were kept."""
        if self.cache is not None and not crop_cache(self.cache, n):
            self.cache, n = None, 0  # a sliding window dropped what is needed: read again from the start
        if self.memory is not None:
            self.memory = [(k[:, :, :n], v[:, :, :n]) for k, v in self.memory] if n else None
        self.ids, self.keys = self.ids[:n], self.keys[:n]
        return n


class ComposedDecoder:
    """The state of one composed generation (batch of one)."""

    def __init__(self, calm, prompt_text: str, add_special_tokens: bool, use_cache: bool, scales: list[float] | None = None):
        self.calm, self.prompt, self.use_cache = calm, prompt_text, use_cache
        tokenizer = calm.anchor.tokenizer
        ids, offsets, special = alignment.tokenize(tokenizer, [prompt_text], add_special_tokens)
        if not ids[0]:
            raise CALMError("The prompt gives no tokens; write a prompt (or use a tokenizer that adds BOS).")
        self.ids, self.keys = list(ids[0]), alignment.anchor_keys(offsets[0], special[0])
        self.text = IncrementalText(tokenizer, self.ids)
        self.scales = scales if scales is not None else calm.block_scales(decoding=True)  # fixed for the whole generation
        self.active = [k for k in range(len(calm.augments)) if any(self.scales[i] for i in calm._block_range(k))]
        self.tracks = {k: _AugmentTrack() for k in self.active}
        self.cache, self.done = None, 0

    def append(self, token_id: int) -> str:
        piece = self.text.push(token_id)
        self.ids.append(token_id)
        self.keys.append(len(self.prompt) + len(self.text.stable()))
        return piece

    def _augment_view(self, k: int) -> tuple[list[int], list[int], list[int]]:
        return augment_view(self.calm, k, self.prompt, self.text, self.ids, self.keys)

    def next_logits(self) -> torch.Tensor:
        """Anchor logits (vocab,) for the token after everything appended so far."""
        calm, device = self.calm, self.calm.anchor.model.device
        start = self.done if self.use_cache else 0
        views = {}
        for k in self.active:
            track, (ids, keys, anchor_keys) = self.tracks[k], self._augment_view(k)
            views[k] = anchor_keys
            keep = _common_prefix(track.ids, ids) if self.use_cache else 0
            if keep < len(track.ids):
                # Anchor positions that could see a token that has now changed must be recomputed.
                start = min(start, first_stale(track.keys, keys, keep, anchor_keys, self.done))
                if self.use_cache:
                    keep = track.crop(keep)
                else:
                    track.__init__()
            if track.cache is None and self.use_cache:
                track.cache = new_cache(calm.augments[k].model.config)
            if len(ids) > keep:
                new = torch.tensor([ids[keep:]])
                states = calm.augment_states(k, new, cache=track.cache)
                memory = [block.memory(s.to(device)) for block, s in zip(calm.bridge.augments[k].blocks, states)]
                if track.memory is not None:
                    memory = [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)) for (k0, v0), (k1, v1) in zip(track.memory, memory)]
                track.memory = memory
            track.ids, track.keys = list(ids), list(keys)
        if self.use_cache:
            if self.cache is None or not crop_cache(self.cache, start):
                self.cache, start = new_cache(calm.anchor.model.config), 0
        condition = []
        for k in self.active:
            anchor_keys = torch.tensor([views[k][start:]])
            track = self.tracks[k]
            visible = alignment.visibility(
                anchor_keys, torch.ones_like(anchor_keys, dtype=torch.bool),
                torch.tensor([track.keys]), torch.ones(1, len(track.keys), dtype=torch.bool),
            )
            condition.append((k, track.memory, visible.to(device)))
        with torch.no_grad():
            logits = calm.anchor_logits(torch.tensor([self.ids[start:]], device=device), None, condition,
                                        cache=self.cache, scales=self.scales, last_only=True)
        self.done = len(self.ids)
        return logits[0, -1]


def augment_view(calm, k: int, prompt: str, text: IncrementalText, ids: list[int], keys: list[int]):
    """(augmenting ids, their keys, the anchor keys to compare them with) for a prompt and the text
    generated so far: with a shared tokenizer the anchor's own ids at their positions, else the text
    re-tokenized for augmenting model k."""
    if calm.shared[k]:
        positions = list(range(len(ids)))
        return ids, positions, positions
    whole = prompt + text.stable()
    aug_ids, offsets, special = alignment.tokenize(calm.augments[k].tokenizer, [whole])
    return aug_ids[0], alignment.augment_keys(offsets[0], special[0], len(whole)), keys


def first_stale(old_keys: list[int], new_keys: list[int], keep: int, anchor_keys: list[int], cached: int) -> int:
    """The first of `cached` anchor positions that could see an augmenting token from index `keep` on,
    which re-tokenization changed (old and new keys of that token: the earlier bounds it)."""
    threshold = min(old_keys[keep], new_keys[keep] if keep < len(new_keys) else old_keys[keep])
    return next((i for i in range(cached) if anchor_keys[i] >= threshold), cached)


def new_cache(config) -> DynamicCache:
    """A KV cache that can be rolled back: sliding-window layers keep their whole past (crop_cache)."""
    cache = DynamicCache(config=config)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def crop_cache(cache: DynamicCache, keep: int) -> bool:
    """Keep the first `keep` positions. A sliding-window layer that records its past is cut by hand:
    its own crop() also trims to the window, after which the next rollback could not be served.
    False (cache untouched) when a layer cannot go back that far: the caller starts over from 0."""
    length = cache.get_seq_length()
    if keep >= length:
        return True
    remove = length - keep
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False) and layer.is_initialized and layer.keys.shape[-2] < remove:
            return False
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False) and getattr(layer, "record_past", False):
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[..., :-remove, :], layer.values[..., :-remove, :]
                layer.cumulative_length -= remove
        else:
            layer.crop(-remove)
    return True


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def render_prompt(tokenizer, prompt) -> tuple[str, bool]:
    """(text both models read, whether the anchor tokenizer should add its special tokens).
    Chat messages go through the anchor's chat template when it has one."""
    if isinstance(prompt, str):
        return prompt, True
    messages = list(prompt)
    if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise CALMError("A chat prompt is a list of {'role': ..., 'content': ...} messages.")
    messages = [{"role": m["role"], "content": message_text(m["content"])} for m in messages]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), False
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nassistant:", True


def message_text(content) -> str:
    """Gradio 6 sends content as a list of parts; keep the text ones."""
    if isinstance(content, str):
        return content
    return " ".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)


def eos_ids(calm) -> set[int]:
    ids = set()
    for source in (getattr(calm.anchor.model, "generation_config", None), calm.anchor.tokenizer):
        value = getattr(source, "eos_token_id", None)
        ids.update(value if isinstance(value, (list, tuple)) else [] if value is None else [value])
    return ids


def _max_positions(model) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def stream_tokens(calm, prompt, max_new_tokens: int, sampling: Sampling, scores: list | None = None, scales=None):
    """(token id, text piece) per generated token, then (None, rest of the text)."""
    text, add_special = render_prompt(calm.anchor.tokenizer, prompt)
    decoder = ComposedDecoder(calm, text, add_special, sampling.use_cache, scales)
    generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
    stop, limit = eos_ids(calm), _max_positions(calm.anchor.model)
    for _ in range(max_new_tokens):
        if limit is not None and len(decoder.ids) >= limit:
            break
        logits = decoder.next_logits()
        if scores is not None:
            scores.append(logits.detach().float().cpu())
        token = pick_next(logits, sampling, generator)
        if token in stop:
            break
        yield token, decoder.append(token)
    yield None, decoder.text.flush()


def stream(calm, prompt, max_new_tokens: int = 32, scales=None, **kwargs):
    sampling = Sampling(**kwargs)  # validated now, not at the first next()
    return _pieces(stream_tokens(calm, prompt, max_new_tokens, sampling, scales=scales))


def _pieces(tokens):
    for _, piece in tokens:
        if piece:
            yield piece


def generate(calm, prompt, max_new_tokens: int = 32, return_dict: bool = False, scales=None, **kwargs):
    sampling, scores, ids, pieces = Sampling(**kwargs), [], [], []
    for token, piece in stream_tokens(calm, prompt, max_new_tokens, sampling, scores if return_dict else None, scales):
        if token is not None:
            ids.append(token)
        pieces.append(piece)
    text = "".join(pieces)
    return GenerationResult(text, ids, scores) if return_dict else text
