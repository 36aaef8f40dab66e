"""Exactness, causality and padding of the composed forward pass, across architectures."""
import pytest
import torch

from calm_core import CALMConfig, CALMError, ComposedLM
from calm_core.engine.alignment import tokenize
from calm_core.models.tiny import ARCHITECTURES

from .conftest import make_pair, randomize_bridge

# Every architecture once as anchor and once as augment, each paired with a different one.
PAIRS = list(zip(ARCHITECTURES, ARCHITECTURES[1:] + ARCHITECTURES[:1]))
# (anchor tokenizer, augment tokenizer): shared, and different (one adds BOS, one does not).
TOKENIZERS = {"shared": ("char_bos", "char_bos"), "different": ("char_bos", "bpe"), "bpe_anchor": ("bpe_bos", "char")}


def build(tokenizers, anchor_arch, augment_arch, mode, gate="channel", insert="after", recency=0, null_slot=False,
          window=0):
    anchor_tok, augment_tok = TOKENIZERS[mode]
    anchor = make_pair(anchor_arch, tokenizers[anchor_tok], layers=4, width=32, seed=1)
    augment = make_pair(augment_arch, tokenizers[augment_tok], layers=2, width=16, heads=2, seed=2)
    return ComposedLM(anchor, [augment], CALMConfig(every=1, gate=gate, insert=insert, recency=recency,
                                                    null_slot=null_slot, window=window))


def anchor_alone(calm, texts):
    enc = calm.encode(texts).anchor
    return calm.anchor.model(input_ids=enc.input_ids, attention_mask=enc.attention_mask.long()).logits


TEXTS = ["the quick brown fox", "naïve café: 12 + 30 = 42", "a"]


@pytest.mark.parametrize("insert", ["after", "before"])
@pytest.mark.parametrize("mode", list(TOKENIZERS))
@pytest.mark.parametrize("anchor_arch, augment_arch", PAIRS)
@torch.no_grad()
def test_closed_gates_give_the_anchor_exactly(tokenizers, anchor_arch, augment_arch, mode, insert):
    calm = build(tokenizers, anchor_arch, augment_arch, mode, insert=insert)
    composed, reference = calm.logits(TEXTS), anchor_alone(calm, TEXTS)
    mask = calm.encode(TEXTS).anchor.attention_mask
    assert composed.shape == reference.shape
    torch.testing.assert_close(composed[mask], reference[mask], atol=1e-5, rtol=0)


def prefix_positions(calm, a, b):
    """Anchor positions whose token is the same in both texts and ends inside their common prefix."""
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    ids, offsets, _ = tokenize(calm.anchor.tokenizer, [a, b])
    n = 0
    for (ia, oa), (ib, ob) in zip(zip(ids[0], offsets[0]), zip(ids[1], offsets[1])):
        if ia != ib or oa != ob or oa[1] > common:
            break
        n += 1
    return n


# Text pairs that differ after a word boundary.
EDITS = [
    ("the quick brown fox", "the quick brown cat jumps"),
    ("hello world, this is", "hello world! that was"),
    ("naïve café is here", "naïve cafés are there"),
    ("12 + 30 = 42", "12 + 30 = 4200"),
]


@pytest.mark.parametrize("insert, recency, null_slot, window", [("after", 0, False, 0), ("before", 0, False, 0),
                                                              ("after", 3, False, 0), ("before", 3, True, 1)])
@pytest.mark.parametrize("mode", list(TOKENIZERS))
@pytest.mark.parametrize("anchor_arch, augment_arch", PAIRS[:4])
@torch.no_grad()
def test_no_information_flows_from_the_future(tokenizers, anchor_arch, augment_arch, mode, insert, recency, null_slot,
                                               window):
    calm = randomize_bridge(build(tokenizers, anchor_arch, augment_arch, mode, insert=insert, recency=recency,
                                  null_slot=null_slot, window=window))
    for a, b in EDITS:
        n = prefix_positions(calm, a, b)
        assert n > 0
        la, lb = calm.logits([a])[0, :n], calm.logits([b])[0, :n]
        torch.testing.assert_close(la, lb, atol=1e-5, rtol=0)
        # ... while the bridge does change those positions: the test would notice a leak.
        with calm.gate_scale(0):
            assert not torch.allclose(calm.logits([a])[0, :n], la, atol=1e-4)


@pytest.mark.parametrize("anchor_arch", ARCHITECTURES)
@torch.no_grad()
def test_before_a_layer_is_after_the_one_below(tokenizers, anchor_arch):
    """insert="before" at anchor layer j + 1 is the same point as insert="after" at layer j, and
    "before" layer 0 writes into the token embeddings (the first layer's input)."""
    anchor = make_pair(anchor_arch, tokenizers["char_bos"], layers=3, width=32, seed=1)
    augment = make_pair("llama", tokenizers["char_bos"], layers=2, width=16, heads=2, seed=2)
    after = randomize_bridge(ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[0, 1], augment_layers=[0, 1])))
    before = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[1, 2], augment_layers=[0, 1], insert="before"))
    before.bridge.load_state_dict(after.bridge.state_dict())
    torch.testing.assert_close(before.logits(TEXTS), after.logits(TEXTS), atol=1e-5, rtol=1e-5)
    first = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[0], augment_layers=[1], insert="before"))
    randomize_bridge(first)
    seen = {}

    def look(module, args, kwargs):
        seen["input"] = args[0] if args else kwargs["hidden_states"]

    handle = first.anchor.layers[0].register_forward_pre_hook(look, with_kwargs=True)
    try:
        first.logits(["hello"])
    finally:
        handle.remove()
    embeddings = anchor[0].get_input_embeddings()(first.encode(["hello"]).anchor.input_ids)
    assert seen["input"].shape == embeddings.shape and not torch.allclose(seen["input"], embeddings)


@torch.no_grad()
def test_recency_biases_start_at_zero_and_favour_the_newest_states(tokenizers):
    """With recency biases the bridge starts exactly as without them; a large bias for age 0 makes each
    anchor token attend to the newest augmenting token it may see (its own, with a shared tokenizer)."""
    plain = randomize_bridge(build(tokenizers, "llama", "gpt2", "shared"))
    aged = build(tokenizers, "llama", "gpt2", "shared", recency=3)
    aged.bridge.load_state_dict(plain.bridge.state_dict(), strict=False)
    torch.testing.assert_close(aged.logits(TEXTS), plain.logits(TEXTS), atol=1e-5, rtol=1e-5)
    for block in aged.bridge.blocks():
        block.recency.data[:, 0] = 50.0
    with aged.record_attention() as rec:
        aged.logits(["hello world"])
    weights = rec.maps[0][0]  # (heads, T, T_aug)
    newest = rec.maps[0][0].shape[-1] - 1
    assert torch.allclose(weights[:, -1, newest], torch.ones(weights.shape[0]), atol=1e-3)
    diagonal = weights.diagonal(dim1=-2, dim2=-1)
    assert (diagonal > 0.99).all()


@pytest.mark.parametrize("mode", list(TOKENIZERS))
@torch.no_grad()
def test_the_null_slot_starts_exact_and_attending_to_it_writes_nothing(tokenizers, mode):
    """Closed gates give the anchor exactly; with open gates, a bridge whose attention all goes to the null
    slot (every real state pushed down by its recency bias) leaves the anchor unchanged, and the recorded
    maps (real states only) then hold ~no weight."""
    calm = build(tokenizers, "llama", "gpt2", mode, recency=2, null_slot=True)
    mask = calm.encode(TEXTS).anchor.attention_mask.bool()
    torch.testing.assert_close(calm.logits(TEXTS)[mask], anchor_alone(calm, TEXTS)[mask], atol=1e-5, rtol=0)
    randomize_bridge(calm)
    assert not torch.allclose(calm.logits(TEXTS)[mask], anchor_alone(calm, TEXTS)[mask], atol=1e-4)
    for block in calm.bridge.blocks():
        block.recency.data.fill_(-1e4)
    torch.testing.assert_close(calm.logits(TEXTS)[mask], anchor_alone(calm, TEXTS)[mask], atol=1e-5, rtol=0)
    with calm.record_attention() as rec:
        calm.logits(["hello"])
    assert all(m.shape[-1] == len(rec.augment_tokens) and m.sum(-1).max() < 1e-3 for m in rec.maps)


@pytest.mark.parametrize("mode", list(TOKENIZERS))
@torch.no_grad()
def test_padding_never_changes_a_row(tokenizers, mode):
    calm = randomize_bridge(build(tokenizers, "llama", "gpt2", mode))
    alone = calm.logits(["a short one"])[0]
    batched = calm.logits(["a short one", "and a much longer text that forces padding"])[0, : alone.shape[0]]
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_a_position_that_sees_nothing_gets_zero_not_nan(tokenizers):
    # The anchor adds BOS, the augment does not: the anchor's BOS may see no augmenting token.
    calm = randomize_bridge(build(tokenizers, "gpt2", "llama", "different"))
    logits = calm.logits(["hello"])
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[0, 0], anchor_alone(calm, ["hello"])[0, 0], atol=1e-6, rtol=0)
    with calm.record_attention() as rec:
        calm.logits(["hello"])
    assert all(torch.all(m[0, :, 0] == 0) for m in rec.maps)


@pytest.mark.parametrize("gate", ["channel", "scalar", "none"])
def test_gate_types(tokenizers, gate):
    calm = build(tokenizers, "gpt2", "qwen2", "different", gate=gate)
    sizes = {"channel": 32, "scalar": 1, "none": 1}
    assert [g.shape for g in calm.gates()] == [torch.Size([sizes[gate]])] * 2
    assert all(torch.all(g == (1.0 if gate == "none" else 0.0)) for g in calm.gates())


def test_bridge_holds_every_trainable_parameter_and_nothing_else(composed):
    assert all(p.requires_grad for p in composed.bridge.parameters())
    for member in [composed.anchor] + composed.augments:
        assert not any(p.requires_grad for p in member.model.parameters())
        assert not member.model.training
    assert not set(map(id, composed.bridge.parameters())) & {
        id(p) for m in [composed.anchor] + composed.augments for p in m.model.parameters()
    }


def test_training_moves_only_the_bridge_and_opens_the_gates(composed):
    frozen = {
        name: p.clone() for member in [composed.anchor] + composed.augments
        for name, p in member.model.named_parameters(prefix=member.info.architecture)
    }
    optimizer = torch.optim.AdamW(composed.bridge.parameters(), lr=1e-2)
    batch = composed.encode(["hello world", "the quick brown fox"])
    for _ in range(3):
        logits = composed.forward(batch)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1), batch.anchor.input_ids[:, 1:].flatten(), reduction="none"
        )[batch.anchor.attention_mask[:, 1:].flatten()].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for member in [composed.anchor] + composed.augments:
        for name, p in member.model.named_parameters(prefix=member.info.architecture):
            assert torch.equal(p, frozen[name]), name
            assert p.grad is None
    assert all(g.abs().max() > 0 for g in composed.gates())


def test_gate_scale_and_layers_off(composed):
    randomize_bridge(composed)
    texts = ["hello world"]
    with torch.no_grad():
        full, reference = composed.logits(texts), anchor_alone(composed, texts)
        with composed.gate_scale(0.0):
            assert torch.equal(composed.logits(texts), reference)
        with composed.layers_off([0, 1]):
            assert torch.equal(composed.logits(texts), reference)
        with composed.layers_off([1]):
            only_first = composed.logits(texts)
        assert not torch.allclose(only_first, full) and not torch.allclose(only_first, reference)
        with composed.gate_scale(2.0):
            assert not torch.allclose(composed.logits(texts), full)
        torch.testing.assert_close(composed.logits(texts), full)  # contexts restore the state
    with pytest.raises(CALMError, match="do not exist"):
        with composed.layers_off([5]):
            pass


def test_record_attention(composed):
    randomize_bridge(composed)
    with torch.no_grad(), composed.record_attention() as rec:
        composed.logits(["hello world", "the fox"])
    assert len(rec.maps) == 2
    assert rec.anchor_tokens[:3] == ["<s>", "h", "e"]
    assert "".join(rec.augment_tokens) == "hello world" and len(rec.augment_tokens) > 1
    for m in rec.maps:
        assert m.shape == (2, 4, len(rec.anchor_tokens), len(rec.augment_tokens))
        sums = m.sum(-1)
        assert torch.all(((sums - 1).abs() < 1e-5) | (sums == 0))
        assert torch.any(sums == 0)  # padding rows and the BOS see nothing
    assert composed._recorder is None


def test_two_augmenting_models(tokenizers):
    anchor = make_pair("mistral", tokenizers["char_bos"], layers=4, seed=1)
    augments = [make_pair("gpt_neox", tokenizers["bpe"], layers=2, width=16, seed=2),
                make_pair("phi", tokenizers["char_bos"], layers=4, width=16, heads=2, seed=3)]
    calm = ComposedLM(anchor, augments, CALMConfig(every=2))
    assert [p[0] for p in calm.layer_pairs()] == [0, 1, 1]
    assert len(calm.gates()) == 3
    with torch.no_grad():
        torch.testing.assert_close(calm.logits(TEXTS), anchor_alone(calm, TEXTS), atol=1e-5, rtol=0)
        randomize_bridge(calm)
        both = calm.logits(TEXTS)
        with calm.layers_off([0]):
            second_only = calm.logits(TEXTS)
        assert not torch.allclose(both, second_only)
    assert calm.generate("hello", max_new_tokens=5) == calm.generate("hello", max_new_tokens=5, use_cache=False)


def test_bare_models_are_unchanged_and_can_be_wrapped_twice(tokenizers):
    anchor = make_pair("gpt2", tokenizers["char_bos"], layers=2, seed=1)
    augment = make_pair("llama", tokenizers["bpe"], layers=2, seed=2)
    ids = tokenizers["char_bos"](["hello"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        before = anchor[0](ids).logits
        first = randomize_bridge(ComposedLM(anchor, [augment], CALMConfig(every=1)), seed=1)
        second = randomize_bridge(ComposedLM(anchor, [augment], CALMConfig(every=2)), seed=2)
        a, b = first.logits(["hello"]), second.logits(["hello"])
        assert not torch.allclose(a, b)
        torch.testing.assert_close(first.logits(["hello"]), a)
        torch.testing.assert_close(anchor[0](ids).logits, before, atol=0, rtol=0)
    for model in (anchor[0], augment[0]):
        assert not any(m._forward_hooks for m in model.modules())


def test_augmenting_model_stops_after_its_deepest_composition_layer(tokenizers):
    anchor = make_pair("gpt2", tokenizers["char_bos"], layers=2, seed=1)
    augment = make_pair("llama", tokenizers["char_bos"], layers=4, seed=2)
    calm = ComposedLM(anchor, [augment], CALMConfig(augment_layers=[1]))
    ran = []
    handles = [layer.register_forward_pre_hook(lambda m, a, i=i: ran.append(i)) for i, layer in enumerate(calm.augments[0].layers)]
    norm = augment[0].model.norm.register_forward_pre_hook(lambda *a: ran.append("norm"))
    try:
        calm.logits(["hello"])
    finally:
        for h in handles + [norm]:
            h.remove()
    assert ran == [0, 1]


def test_unknown_layout_names_the_architecture():
    from calm_core import ModelLoadError, decoder_layers

    class Strange(torch.nn.Module):
        config = type("C", (), {"architectures": ["StrangeForCausalLM"]})()

    with pytest.raises(ModelLoadError, match="StrangeForCausalLM"):
        decoder_layers(Strange())


def test_a_slow_tokenizer_is_refused_only_when_alignment_needs_offsets(tokenizers):
    class Slow:
        is_fast = False

    anchor = make_pair("gpt2", tokenizers["char_bos"], seed=1)
    augment = make_pair("llama", tokenizers["char_bos"], seed=2)
    with pytest.raises(CALMError, match="not a fast tokenizer"):
        ComposedLM(anchor, [(augment[0], Slow())], CALMConfig(every=1))


@torch.no_grad()
def test_inspection_settings_belong_to_the_calling_thread_and_streams_keep_theirs(composed):
    import threading

    randomize_bridge(composed)
    full, other = composed.logits(["hello"]), {}
    with composed.gate_scale(0):
        thread = threading.Thread(target=lambda: other.setdefault("logits", composed.logits(["hello"])))
        thread.start()
        thread.join()
        pieces = composed.stream("hello", max_new_tokens=6)  # consumed after the context closes
        anchor_text = composed.generate("hello", max_new_tokens=6)
    torch.testing.assert_close(other["logits"], full)
    assert "".join(pieces) == anchor_text != composed.generate("hello", max_new_tokens=6)


@pytest.mark.parametrize("window, null_slot", [(1, False), (2, False), (2, True)])
@torch.no_grad()
def test_a_window_hides_all_but_the_newest_visible_states(window, null_slot):
    """With window W each anchor row reads only its W newest visible augmenting states: changing any older
    state (or one it may not see at all) leaves the row unchanged, changing a newest one changes it."""
    from calm_core.engine.bridge import GatedCrossAttention

    torch.manual_seed(0)
    block = GatedCrossAttention(8, 16, 4, gate="none", window=window, null_slot=null_slot)
    states, anchor = torch.randn(1, 6, 8), torch.randn(1, 5, 16)
    visible = torch.ones(5, 6, dtype=torch.bool).tril(1)[None]  # anchor row t sees augmenting states 0..t+1
    visible[0, 4, 3] = False  # a hole: row 4 sees 0, 1, 2, 4, 5
    out = block(anchor, block.memory(states), visible)
    for row, newest in [(0, [1, 0]), (2, [3, 2]), (4, [5, 4])]:
        for col in range(6):
            changed = states.clone()
            changed[0, col] = torch.randn(8)
            moved = not torch.allclose(block(anchor, block.memory(changed), visible)[0, row], out[0, row])
            assert moved == (col in newest[:window]), (row, col)
