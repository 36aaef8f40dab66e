"""The rows' shared opening (a chat template's system turn) computed once: the frozen-state cache stores the same
states as whole-row forwards, and is not used where it could differ."""
import pytest
import torch

from calm_core import CALMConfig, ComposedLM
from calm_core.models.tiny import SLIDING_WINDOW
from calm_core.training import shared_opening
from calm_core.training.batches import collate, prepare
from calm_core.training.data import Example
from calm_core.training.frozen_cache import FrozenStates
from calm_core.training.shared_opening import common_length

from .conftest import assert_same_bridges, cache_pair, make_pair

SYSTEM = "system: be brief.\nuser: "
CHAT = [Example(SYSTEM + q + "\nbot:", " " + a) for q, a in
        [("abc?", "cba"), ("de?", "ed"), ("fedcba and more?", "no"), ("a?", "a"), ("bad cafe?", "efac dab")] * 3]


@pytest.mark.parametrize("sequences, length", [
    ([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]], 2),
    ([[1, 2, 3], [1, 2, 3, 4]], 2),  # every row keeps a token of its own
    ([[7, 8], [1, 2]], 0),
    ([[5, 6, 7]], 2),
    ([], 0),
])
def test_common_length(sequences, length):
    assert common_length(sequences) == length


def states(calm, rows, share: bool, monkeypatch):
    monkeypatch.setattr(shared_opening, "MIN_TOKENS", 4 if share else 10**9)
    cache = FrozenStates(calm, rows)
    indices = list(range(len(rows)))
    augments, prefix = cache.batch(indices)
    return cache, augments, prefix


@pytest.mark.parametrize("anchor_arch, augment_arch", [
    ("llama", "gpt2"), ("gpt2", "llama"), ("qwen2", "gpt_neox"), ("mistral", "gemma"), ("phi", "opt"),
    ("llama", "gpt_neo")])
def test_the_cache_with_a_shared_opening_stores_what_whole_rows_give(tokenizers, monkeypatch, anchor_arch, augment_arch):
    anchor = make_pair(anchor_arch, tokenizers["char_bos"], layers=4, width=32, seed=1)
    augment = make_pair(augment_arch, tokenizers["bpe"], layers=3, width=24, seed=2)
    calm = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[2, 3], augment_layers=[1, 2]))
    rows, _ = prepare(calm, CHAT)
    shared_cache, shared, shared_prefix = states(calm, rows, True, monkeypatch)
    assert shared_cache.openings["anchor"] is not None and shared_cache.openings["anchor"].length >= len(SYSTEM)
    assert shared_cache.openings[0] is not None
    whole_cache, whole, whole_prefix = states(calm, rows, False, monkeypatch)
    assert whole_cache.openings == {"anchor": None, 0: None}
    batch, _ = collate(calm, rows)
    real, real_augment = batch.anchor.attention_mask, batch.augments[0].attention_mask
    torch.testing.assert_close(shared_prefix[real], whole_prefix[real], atol=1e-5, rtol=1e-5)
    for got, want in zip(shared[0], whole[0]):
        torch.testing.assert_close(got[real_augment], want[real_augment], atol=1e-5, rtol=1e-5)


def test_sliding_window_models_with_rows_past_the_window_run_whole_rows(tokenizers, monkeypatch):
    anchor = make_pair("gemma3", tokenizers["char_bos"], layers=3, width=32, seed=1)
    augment = make_pair("llama", tokenizers["bpe"], layers=2, width=24, seed=2)
    calm = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[2], augment_layers=[1]))
    rows, _ = prepare(calm, CHAT)
    assert max(len(r.anchor_ids) for r in rows) > SLIDING_WINDOW
    cache, _, _ = states(calm, rows, True, monkeypatch)
    assert cache.openings["anchor"] is None and cache.openings[0] is not None


def test_a_run_over_chat_rows_trains_the_same_bridge_with_the_cache_as_without(tokenizers, monkeypatch):
    """The opening is computed once and the cache is on: the same steps reach the same bridge as whole-row forwards."""
    from calm_core.training.trainer import TrainConfig, Trainer

    monkeypatch.setattr(shared_opening, "MIN_TOKENS", 4)
    bridges = []
    for cache in (False, True):
        calm = cache_pair(tokenizers, anchor_layers=[2, 3])
        trainer = Trainer(calm, CHAT, None, TrainConfig(steps=5, lr=3e-3, batch_size=6, warmup_steps=1, progress=False,
                                                       cache_augment_states=cache))
        result = trainer.train()
        assert result.augment_cache == cache
        if cache:
            opened = trainer._states.openings
            assert opened["anchor"].length >= len(SYSTEM)
            assert (f"the opening every row shares is run once ({opened['anchor'].length} tokens for the anchor, "
                    f"{opened[0].length} tokens for the augmenting model)") in result.cache_note
        bridges.append(calm.bridge.state_dict())
    assert_same_bridges(*bridges)
