"""Batched composed generation equals decoding each prompt alone, row by row."""
import pytest
import torch

from calm_core import CALMConfig, ComposedLM

from .conftest import make_pair, randomize_bridge

PROMPTS = ["hello wor", "naïve ca", "12 + 3", "the quick brown fox jumps over", "a", "déjà vu: "]

# (name, anchor (arch, tokenizer), augment (arch, tokenizer), config)
CASES = [
    ("shared tokenizer", ("gpt2", "char_bos"), ("llama", "char_bos"), CALMConfig(every=1)),
    ("different tokenizers", ("gpt2", "char_bos"), ("llama", "bpe"), CALMConfig(every=1)),
    ("bpe anchor", ("llama", "bpe"), ("qwen2", "char_bos"), CALMConfig(every=1)),
    ("window + null slot", ("gpt2", "char_bos"), ("qwen2", "bpe"), CALMConfig(every=1, null_slot=True, window=2, recency=3)),
    ("before, gemma", ("gemma", "bpe_bos"), ("gpt_neox", "char_bos"), CALMConfig(every=1, insert="before")),
]


def build(tokenizers, anchor, augment, config):
    a = make_pair(anchor[0], tokenizers[anchor[1]], layers=4, seed=1)
    b = make_pair(augment[0], tokenizers[augment[1]], layers=2, width=16, heads=2, seed=2)
    return randomize_bridge(ComposedLM(a, [b], config), std=0.5)


@pytest.mark.parametrize("name, anchor, augment, config", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_batch_equals_one_by_one(tokenizers, name, anchor, augment, config):
    calm = build(tokenizers, anchor, augment, config)
    alone = [calm.generate(p, max_new_tokens=20, return_dict=True) for p in PROMPTS]
    together = calm.generate(PROMPTS, max_new_tokens=20, return_dict=True)
    assert [r.text for r in together] == [r.text for r in alone]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    for a, b in zip(alone, together):
        for x, y in zip(a.scores, b.scores):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_rows_stop_on_their_own(tokenizers):
    calm = build(tokenizers, *CASES[1][1:])
    first = calm.generate(PROMPTS[0], max_new_tokens=20, return_dict=True)
    calm.anchor.model.generation_config.eos_token_id = first.token_ids[2]  # row 0 now stops after two tokens
    alone = [calm.generate(p, max_new_tokens=20) for p in PROMPTS]
    assert len(alone[0]) < len(first.text) and max(len(t) for t in alone) > len(alone[0])
    assert calm.generate(PROMPTS, max_new_tokens=20) == alone


def test_batches_are_really_batched(tokenizers, monkeypatch):
    calm = build(tokenizers, *CASES[1][1:])
    from calm_core import generation

    monkeypatch.setattr(generation, "generate", lambda *a, **k: pytest.fail("fell back to one by one"))
    assert len(calm.generate(PROMPTS, max_new_tokens=4)) == len(PROMPTS)


@torch.no_grad()
def test_string_list_and_chat_shapes(tokenizers):
    calm = build(tokenizers, *CASES[1][1:])
    assert isinstance(calm.generate("hello", max_new_tokens=3), str)
    chat = [{"role": "user", "content": "hi"}]
    assert isinstance(calm.generate(chat, max_new_tokens=3), str)  # one chat is one prompt
    both = calm.generate([chat, "hello"], max_new_tokens=3)
    assert both == [calm.generate(chat, max_new_tokens=3), calm.generate("hello", max_new_tokens=3)]


@torch.no_grad()
def test_sampling_with_a_seed_matches_alone(tokenizers):
    calm = build(tokenizers, *CASES[1][1:])
    kwargs = dict(max_new_tokens=12, do_sample=True, temperature=1.3, top_k=20, seed=7)
    assert calm.generate(PROMPTS[:3], **kwargs) == [calm.generate(p, **kwargs) for p in PROMPTS[:3]]


@torch.no_grad()
def test_gate_scale_and_layers_off_hold_for_the_batch(tokenizers):
    calm = build(tokenizers, *CASES[1][1:])
    anchor = ComposedLM((calm.anchor.model, calm.anchor.tokenizer), [])
    with calm.gate_scale(0):
        assert calm.generate(PROMPTS, max_new_tokens=10) == anchor.generate(PROMPTS, max_new_tokens=10)
    with calm.layers_off([0]):
        assert calm.generate(PROMPTS[:2], max_new_tokens=10) == [calm.generate(p, max_new_tokens=10) for p in PROMPTS[:2]]


# Sliding-window attention (a tiny Gemma 3, window 8) as anchor and as augment, with two tokenizers: many
# rollbacks of both caches after the window is full.
@pytest.mark.parametrize("anchor, augment", [(("gemma3", "char_bos"), ("llama", "bpe")),
                                             (("llama", "bpe"), ("gemma3", "char_bos"))], ids=["anchor", "augment"])
@torch.no_grad()
def test_sliding_window_models_cached_uncached_and_batched(tokenizers, anchor, augment, monkeypatch):
    from calm_core import generation

    calm = build(tokenizers, anchor, augment, CALMConfig(every=1))
    prompts = ["the quick brown fox jumps over the lazy dog, naïve café", "hello world, this is"]
    caches, new_cache = [], generation.new_cache
    monkeypatch.setattr(generation, "new_cache", lambda config: caches.append(config) or new_cache(config))
    for prompt in prompts:
        caches.clear()
        cached = calm.generate(prompt, max_new_tokens=24, return_dict=True)
        assert len(caches) == 2  # one per model: rolling back past the window never starts over
        fresh = calm.generate(prompt, max_new_tokens=24, use_cache=False, return_dict=True)
        assert cached.token_ids == fresh.token_ids
        for a, b in zip(cached.scores, fresh.scores):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert calm.generate(prompts, max_new_tokens=24) == [calm.generate(p, max_new_tokens=24) for p in prompts]
    short = ["ab", "c d"]  # a sliding-window augment's grid outgrows its window mid-way: decoded one by one
    assert calm.generate(short, max_new_tokens=12) == [calm.generate(p, max_new_tokens=12) for p in short]
