"""The composed forward with the rows' shared opening run once (engine/opening_forward.py): the same outputs and
the same bridge gradients as the whole batch, and the whole batch wherever that could differ."""
import pytest
import torch

from calm_core import CALMConfig, ComposedLM
from calm_core.engine import opening_forward
from calm_core.engine.anchor_prefix import prefix_states
from calm_core.training.batches import collate, predicting_mask, prepare
from calm_core.training.data import Example

from .conftest import make_pair, randomize_bridge
from .test_shared_opening import CHAT, SYSTEM


def composed(tokenizers, anchor_arch, augment_arch, anchor_layers=(2, 3), insert="after", shared_tokens=False):
    anchor = make_pair(anchor_arch, tokenizers["char_bos"], layers=4, width=32, seed=1)
    augment = make_pair(augment_arch, tokenizers["char_bos" if shared_tokens else "bpe"], layers=3, width=24, seed=2)
    calm = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=list(anchor_layers), augment_layers=[1, 2],
                                                    insert=insert, recency=4, null_slot=True, relative=True))
    return randomize_bridge(calm, std=0.2)


def outputs(calm, rows, share: bool, prefix: bool, spy=None):
    """(final hidden states at the targets, the bridge's gradients) of one forward and backward."""
    calm.bridge.zero_grad(set_to_none=True)
    batch, labels = collate(calm, rows)
    positions = predicting_mask(labels)
    stored = prefix_states(calm, batch.anchor.input_ids, batch.anchor.attention_mask) if prefix else None
    hidden = calm.forward(batch, anchor_prefix=stored, positions=positions, hidden_only=True, share_opening=share)
    (hidden.pow(2).mean() + hidden.sum() * 1e-3).backward()
    return hidden.detach(), {n: p.grad.clone() for n, p in calm.bridge.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("anchor_arch, augment_arch, prefix, insert, shared_tokens", [
    ("llama", "gpt2", True, "after", False),  # the trainer's path: frozen prefix replayed
    ("llama", "gpt2", False, "after", False),  # no prefix: every anchor layer runs on the opening once
    ("qwen2", "gpt_neox", True, "before", False),
    ("gpt2", "llama", True, "after", False),
    ("mistral", "gemma", False, "after", False),
    ("llama", "llama", True, "after", True),  # one tokenizer: positional alignment
])
def test_sharing_the_opening_gives_the_whole_batch_outputs_and_gradients(tokenizers, monkeypatch, anchor_arch,
                                                                       augment_arch, prefix, insert, shared_tokens):
    calm = composed(tokenizers, anchor_arch, augment_arch, insert=insert, shared_tokens=shared_tokens)
    rows, _ = prepare(calm, CHAT[:6])
    shared_runs = []
    real = opening_forward.run_sharing_opening
    monkeypatch.setattr(opening_forward, "run_sharing_opening",
                        lambda *a, **kw: shared_runs.append(a[4]) or real(*a, **kw))
    want, want_grads = outputs(calm, rows, share=False, prefix=prefix)
    assert not shared_runs
    got, got_grads = outputs(calm, rows, share=True, prefix=prefix)
    assert shared_runs and shared_runs[0] >= len(SYSTEM) - 1  # the system turn was run once
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert got_grads.keys() == want_grads.keys() and any(g.abs().sum() > 0 for g in want_grads.values())
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def lengths(calm, rows):
    batch, labels = collate(calm, rows)
    positions = predicting_mask(labels)
    condition = [(0, None, calm.visibility(0, batch.anchor, batch.augments[0]))]
    return opening_forward.opening_length(batch.anchor.input_ids, batch.anchor.attention_mask, positions, condition,
                                          [batch.augments[0].input_ids])


@pytest.mark.parametrize("examples, shared", [
    (CHAT[:4], True),
    (CHAT[:1], False),  # one row: nothing to share
    ([Example("", SYSTEM + "abc? bot: cba"), Example("", SYSTEM + "de? bot: ed")], False),  # targets from the start
    ([Example("a system: be brief.\nuser: abc?", " x"), Example("the system: be brief.\nuser: de?", " y")], False),  # differ early
])
def test_the_opening_is_shared_only_where_rows_agree_and_hold_no_target(tokenizers, examples, shared):
    calm = composed(tokenizers, "llama", "gpt2")
    rows, _ = prepare(calm, examples)
    length, seen = lengths(calm, rows)
    assert bool(length) == shared
    if shared:
        assert length >= opening_forward.MIN_TOKENS and seen[0] > 0


def test_a_sliding_window_anchor_past_its_window_runs_whole(tokenizers):
    from calm_core.models.tiny import SLIDING_WINDOW

    calm = composed(tokenizers, "gemma3", "llama")
    rows, _ = prepare(calm, CHAT)
    assert max(len(r.anchor_ids) for r in rows) > SLIDING_WINDOW
    batch, labels = collate(calm, rows)
    got = opening_forward.opening_length(batch.anchor.input_ids, batch.anchor.attention_mask, predicting_mask(labels),
                                         [(0, None, calm.visibility(0, batch.anchor, batch.augments[0]))],
                                         [batch.augments[0].input_ids], opening_forward.sliding_window(calm.anchor.model))
    assert got == (0, [])


def test_no_target_mask_means_no_sharing(tokenizers):
    calm = composed(tokenizers, "llama", "gpt2")
    rows, _ = prepare(calm, CHAT[:4])
    batch, _ = collate(calm, rows)
    full = calm.forward(batch, share_opening=True)  # every position's logits: the whole batch
    assert full.shape[:2] == batch.anchor.input_ids.shape


def test_an_opening_reads_augmenting_states_only_where_every_earlier_token_agrees():
    """A visible augmenting state depends on every token before it: rows that differ earlier, even where the opening
    sees nothing, have different states there, so the opening is not shared."""
    ids, mask = torch.ones(2, 12, dtype=torch.long), torch.ones(2, 12, dtype=torch.long)
    positions = torch.zeros(2, 12, dtype=torch.bool)
    positions[:, 10] = True
    visible = torch.zeros(2, 12, 6, dtype=torch.bool)
    visible[:, :, 3:5] = True  # a window: the opening reads augmenting tokens 3 and 4 only
    same = torch.tensor([[5, 6, 7, 8, 9, 1], [5, 6, 7, 8, 9, 2]])
    assert opening_forward.opening_length(ids, mask, positions, [(0, None, visible)], [same]) == (10, [5])
    earlier = torch.tensor([[5, 6, 7, 8, 9, 1], [4, 6, 7, 8, 9, 2]])  # differs at token 0, which no position sees
    assert opening_forward.opening_length(ids, mask, positions, [(0, None, visible)], [earlier]) == (0, [])
