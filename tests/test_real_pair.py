"""The engine on two real pretrained models: Gemma 3 270M (base) and SmolLM2-135M-Instruct, both ways.

Runs when the pair is prepared (`python -m calm_core.models.real_pair`; .ci/run does it), else skips. The
pair is the hard case: a 262k SentencePiece vocabulary with byte fallback that pads on the left and
uses sliding-window attention (512) against a 49k byte-level BPE with a chat template.
"""
import functools

import pytest
import torch

from calm_core import CALMConfig, ComposedLM, load_causal_lm
from calm_core.engine.generation import render_prompt
from calm_core.models.real_pair import prepared_pair
from calm_core.training.data import Example
from calm_core.training.trainer import TrainConfig, Trainer

from .test_compose import prefix_positions

PAIR = prepared_pair()
pytestmark = pytest.mark.skipif(PAIR is None, reason="real pair not prepared: python -m calm_core.models.real_pair")

# anchor, augment, every (6 composition layers either way)
DIRECTIONS = {"gemma<-smollm2": ("gemma", "smollm2", 5), "smollm2<-gemma": ("smollm2", "gemma", 3)}
TEXTS = [  # accents, CJK, emoji, runs of spaces and newlines
    "Crème brûlée in Zürich costs 12,50 €.",
    "東京は日本の首都です。 Tokyo is the capital.",
    "Party time 🎉🎉 with   three spaces\n\n\nand newlines",
]
EDITS = [("Crème brûlée is a dessert", "Crème brûlée was eaten"), ("東京は日本の首都です。", "東京は大きい都市"),
         ("Party 🎉 time   and\n\nmore", "Party 🎉 time   or\n\nless")]


@functools.lru_cache(maxsize=None)
def model(key):
    return load_causal_lm(str(PAIR[key]))


def compose(direction, seed=None, std=0.02):
    anchor, augment, every = DIRECTIONS[direction]
    calm = ComposedLM(model(anchor), [model(augment)], CALMConfig(every=every))
    if seed is not None:  # an open, random bridge: every path through it matters
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, p in calm.bridge.named_parameters():
                p.fill_(1.0) if name.endswith("gate") else p.normal_(0, std) if p.dim() > 1 else None
    return calm


@pytest.fixture(params=list(DIRECTIONS))
def direction(request):
    return request.param


@torch.no_grad()
def test_closed_gates_equal_the_anchor_exactly(direction):
    calm = compose(direction)
    batch = calm.encode(TEXTS)
    alone = calm.anchor.model(input_ids=batch.anchor.input_ids, attention_mask=batch.anchor.attention_mask.long()).logits
    assert torch.equal(calm.forward(batch), alone)


@torch.no_grad()
def test_no_future_leak_with_an_open_random_bridge(direction):
    calm = compose(direction, seed=0)
    for a, b in EDITS:
        n = prefix_positions(calm, a, b)
        assert n > 1
        la, lb = calm.logits([a])[0, :n], calm.logits([b])[0, :n]
        torch.testing.assert_close(la, lb, atol=1e-4, rtol=1e-4)
        with calm.gate_scale(0):  # the bridge does change these positions: a leak would show
            assert not torch.allclose(calm.logits([a])[0, :n], la, atol=1e-3)


@torch.no_grad()
def test_padding_does_not_change_a_row(direction):
    calm = compose(direction, seed=1)
    together = calm.logits(TEXTS)
    for i, text in enumerate(TEXTS):
        alone = calm.logits([text])[0]
        torch.testing.assert_close(together[i, :alone.shape[0]], alone, atol=2e-4, rtol=1e-4)


@torch.no_grad()
def test_cached_equals_uncached_past_the_sliding_window(direction):
    calm = compose(direction, seed=2)
    prompt = " ".join(f"Item {i}: the {['red', 'blue', 'green'][i % 3]} box." for i in range(62))  # > 512 tokens each
    assert min(len(m.tokenizer(prompt)["input_ids"]) for m in [calm.anchor] + calm.augments) > 512
    cached = calm.generate(prompt, max_new_tokens=3, return_dict=True)  # two steps read the cache past the window
    fresh = calm.generate(prompt, max_new_tokens=3, use_cache=False, return_dict=True)
    assert cached.token_ids == fresh.token_ids


@torch.no_grad()
def test_batched_generation_equals_one_by_one(direction):
    calm = compose(direction, seed=3)
    prompts = TEXTS + ["The capital of France is", "1, 2, 3,"]
    assert calm.generate(prompts, max_new_tokens=8) == [calm.generate(p, max_new_tokens=8) for p in prompts]


@torch.no_grad()
def test_save_and_load_round_trip(direction, tmp_path):
    calm = compose(direction, seed=4)
    calm.save_pretrained(tmp_path)
    anchor, augment, _ = DIRECTIONS[direction]
    loaded = ComposedLM.from_pretrained(tmp_path, anchor=model(anchor), augments=[model(augment)])
    assert torch.equal(loaded.logits(TEXTS[:1]), calm.logits(TEXTS[:1]))


def _checksums(members):
    return [float(p.double().sum()) for m in members for p in m.model.parameters()]


# bf16 is emulated on CPUs without native bf16 (20+ s a step here): with Gemma as the anchor only, the harder way
# (262k vocabulary through the fused loss, left padding, sliding window)
@pytest.mark.parametrize("direction, bf16", [("gemma<-smollm2", False), ("smollm2<-gemma", False),
                                             ("gemma<-smollm2", True)],
                         ids=["gemma<-smollm2-float32", "smollm2<-gemma-float32", "gemma<-smollm2-bf16"])
def test_training_changes_only_the_bridge(direction, bf16):
    calm = compose(direction)
    before_models, before_bridge = _checksums([calm.anchor] + calm.augments), _copy(calm.bridge)
    examples = [Example(f"Q: Where does Zorblat {i} live?\nA:", f" In Quillmoor {i}.") for i in range(8)]
    config = TrainConfig(steps=1, batch_size=4, lr=1e-2, warmup_steps=0, bf16=bf16, progress=False, eval_every=100)
    result = Trainer(calm, examples, None, config).train()
    assert result.step == 1
    assert _checksums([calm.anchor] + calm.augments) == before_models
    after = calm.bridge.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before_bridge[k], v) for k, v in after.items())


def _copy(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_chat_prompts_follow_each_anchor(direction):
    calm = compose(direction)
    messages = [{"role": "user", "content": "Say hello."}]
    text, add_special = render_prompt(calm.anchor.tokenizer, messages)
    if DIRECTIONS[direction][0] == "smollm2":  # an instruct model: its own chat template
        assert "<|im_start|>user" in text and text.rstrip().endswith("assistant") and not add_special
    else:  # a base model without a template: plain role lines
        assert text == "user: Say hello.\nassistant:" and add_special
    with torch.no_grad():
        assert isinstance(calm.generate(messages, max_new_tokens=4), str)
