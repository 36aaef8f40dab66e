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
