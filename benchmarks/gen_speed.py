"""Generation speed: new tokens per second from one prompt, batch 1, greedy.

Systems:
  ours          ComposedLM.generate with KV caches on both models (both run on every new token)
  ours_uncached the same with use_cache=False: every step re-reads the whole text
  anchor_hf     the anchor alone, Hugging Face generate (cached)
  augment_hf    the augment alone, Hugging Face generate (cached)
  peer          calm-pytorch's generate (peer_calm_pytorch.py)
  ours_char     ours with a character-level augment (models.compose_char_augment): two tokenizers,
                the text re-tokenized for the augment at every step
  char_augment_hf  that augment alone, Hugging Face generate from the prompt's characters

Every system produces exactly new_tokens tokens: the models are random, so one that emitted
</s> early would look faster, and end-of-sequence stopping is switched off everywhere.
"""
from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import torch

from calm_core import generation

from . import peer_calm_pytorch
from .measure import median_seconds


@contextmanager
def no_eos():
    """ComposedLM.generate stops at the anchor's EOS ids; report none while timing."""
    with mock.patch.object(generation, "eos_ids", lambda calm: set()):
        yield


def hf_generate(model, ids: torch.Tensor, new_tokens: int) -> None:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert out.shape[1] == ids.shape[1] + new_tokens, out.shape


def ours_generate(calm, text: str, new_tokens: int, use_cache: bool = True) -> None:
    with no_eos():
        out = calm.generate(text, max_new_tokens=new_tokens, return_dict=True, use_cache=use_cache)
    assert len(out.token_ids) == new_tokens, len(out.token_ids)


SYSTEMS = ("ours", "ours_uncached", "anchor_hf", "augment_hf", "peer", "ours_char", "char_augment_hf")


def measure(calm, text: str, ids: torch.Tensor, new_tokens: int, repeats: int, peer=None, char_calm=None,
            systems=SYSTEMS) -> dict:
    """{system: {"s": median seconds for new_tokens tokens, "tokens_per_s": ...}} for the
    requested systems that were given models; text and ids are the same prompt (ids: (1, prompt
    tokens)). The uncached and two-tokenizer runs are side figures and cost more, so they get half
    the repeats."""
    calls = {
        "ours": (lambda: ours_generate(calm, text, new_tokens), repeats),
        "ours_uncached": (lambda: ours_generate(calm, text, new_tokens, use_cache=False), max(1, repeats // 2)),
        "anchor_hf": (lambda: hf_generate(calm.anchor.model, ids, new_tokens), repeats),
        "augment_hf": (lambda: hf_generate(calm.augments[0].model, ids, new_tokens), repeats),
    }
    if peer is not None:
        calls["peer"] = (lambda: peer_calm_pytorch.generate(peer, ids, new_tokens), repeats)
    if char_calm is not None:
        member = char_calm.augments[0]
        char_ids = member.tokenizer(text, return_tensors="pt")["input_ids"]
        calls["ours_char"] = (lambda: ours_generate(char_calm, text, new_tokens), max(1, repeats // 2))
        calls["char_augment_hf"] = (lambda: hf_generate(member.model, char_ids, new_tokens), max(1, repeats // 2))
    out = {}
    for name in systems:
        if name in calls:
            fn, n = calls[name]
            seconds = median_seconds(fn, n)
            out[name] = {"s": seconds, "tokens_per_s": new_tokens / seconds, "repeats": n}
    return out
