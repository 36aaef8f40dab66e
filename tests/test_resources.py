"""Nothing accumulates across calls: hooks are removed, memory stays flat."""
import gc
import tracemalloc

import torch

from .conftest import randomize_bridge


def hooks(calm):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
               for member in [calm.anchor] + calm.augments for m in member.model.modules())


def test_hooks_are_removed_even_when_a_forward_fails(composed):
    composed.logits(["hello"])
    assert hooks(composed) == 0
    try:
        composed.forward(composed.encode(["hello"]), augment_states=[[torch.zeros(1, 1, 3)]])
    except Exception:
        pass
    assert hooks(composed) == 0


@torch.no_grad()
def test_memory_stays_flat_over_many_calls(composed):
    randomize_bridge(composed)

    def work():
        composed.logits(["hello world", "the quick brown fox"])
        composed.generate("hello", max_new_tokens=8)
        with composed.record_attention():
            composed.logits(["hello"])

    for _ in range(3):
        work()
    gc.collect()
    tracemalloc.start()
    work()
    gc.collect()
    first, _ = tracemalloc.get_traced_memory()
    for _ in range(20):
        work()
    gc.collect()
    last, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert last - first < 256 * 1024, f"grew by {last - first} bytes"
    assert hooks(composed) == 0


def test_a_cached_step_is_estimated_as_the_anchor_above_the_bridge(tokenizers):
    """With the frozen-state cache on, a step runs neither augmenting model nor the anchor's layers below the
    bridge: its estimate is smaller, so the cache budget (room - the cached step) is not eaten by work that never
    runs; without a prefix to replay, only the augmenting model's share goes."""
    from calm_core import CALMConfig, ComposedLM
    from calm_core.lab.resources import training_bytes

    from .conftest import make_pair

    anchor = make_pair("gpt2", tokenizers["char_bos"], layers=4, width=32, seed=1)
    augment = make_pair("llama", tokenizers["bpe"], layers=4, width=24, seed=2)
    high = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[3], augment_layers=[4]))  # prefix: 4 layers
    low = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[0], augment_layers=[4], insert="before"))
    for calm in (high, low):
        assert training_bytes(calm, 8, 64, cached=True) < training_bytes(calm, 8, 64)
        assert training_bytes(calm, 16, 64, cached=True) > training_bytes(calm, 8, 64, cached=True)
    assert training_bytes(high, 8, 64, cached=True) < training_bytes(low, 8, 64, cached=True)


def test_frozen_states_are_chunked_by_length_and_stored_once_per_layer(tokenizers):
    """Rows of similar length share a chunk (less padding computed and kept), in an order that depends on the rows
    alone; blocks reading the same augmenting layer share one stored tensor."""
    from calm_core import CALMConfig, ComposedLM
    from calm_core.training.batches import prepare
    from calm_core.training.examples import Example
    from calm_core.training.frozen_cache import CHUNK, FrozenStates

    from .conftest import make_pair

    anchor = make_pair("gpt2", tokenizers["char_bos"], layers=4, width=32, seed=1)
    augment = make_pair("llama", tokenizers["bpe"], layers=4, width=24, seed=2)
    calm = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[1, 3], augment_layers=[4, 4]))
    rows, _ = prepare(calm, [Example("q" * (1 + (i * 37) % 90) + "=", " a") for i in range(CHUNK + 9)])
    states = FrozenStates(calm, rows)
    lengths = [[len(rows[i].anchor_ids) for i in members] for members in states.members]
    assert max(lengths[0]) <= min(lengths[1]) and sorted(sum(states.members, [])) == list(range(len(rows)))
    assert FrozenStates(calm, rows).members == states.members
    augments, _ = states.batch([0, CHUNK + 3])
    stored = states.chunks[0]["augments"][0]
    assert stored[0] is stored[1] and len(augments[0]) == 2


def test_a_generation_estimate_holds_every_answers_caches_and_one_prefill_at_a_time(composed):
    """The answers stream in turn in one thread: their KV caches coexist, their prompts' activations do not; logits
    exist for the newest position only (a 2,400-token prompt to the real pair was estimated at 28 GB before, 2.7 GB
    now, where the process grew by 1.9 GB)."""
    from calm_core.lab.resources import _element_bytes, generation_bytes

    tokens = 300
    caches = sum(2 * m.info.num_layers * tokens * m.info.width * _element_bytes(composed)
                 for m in [composed.anchor] + composed.augments)
    one, three = generation_bytes(composed, tokens, models=1), generation_bytes(composed, tokens, models=3)
    assert three - one == 2 * caches
