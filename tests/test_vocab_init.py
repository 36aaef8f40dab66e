"""calm_core.training.vocab_init: a bridge's value path started as a map between the two models' output vocabularies."""
import pytest
import torch

from calm_core import CALMConfig, CALMError, ComposedLM
from calm_core.models.loading import final_norm
from calm_core.models.tiny import char_tokenizer, tiny_model
from calm_core.training.vocab_init import init_value_path, output_map, shared_tokens


def test_shared_tokens_pair_equal_strings_across_different_vocabularies():
    a, b = char_tokenizer("abcdefg "), char_tokenizer("gfedxyz ")
    pairs = shared_tokens(a, b)
    assert pairs and all(a.decode([i]) == b.decode([j]) for i, j in pairs)
    assert {a.decode([i]) for i, _ in pairs} == set("defg")  # the lone space is blank: left out
    assert not set(a.all_special_ids) & {i for i, _ in pairs}


def test_output_map_recovers_an_exact_linear_relation():
    g = torch.Generator().manual_seed(0)
    E, R = torch.randn(60, 16, generator=g), torch.randn(16, 12, generator=g)
    M = output_map(E, E @ R, [(i, i) for i in range(60)], ridge=1e-9)
    assert torch.allclose(M, R, atol=1e-3)
    with pytest.raises(CALMError, match="share no token"):
        output_map(E, E @ R, [])


def _pair(anchor_arch: str):
    """An anchor and a narrower augmenting model whose output layer is an exact linear function of the anchor's
    (as its final norm feeds it): the vocabulary map then exists exactly."""
    tok = char_tokenizer()
    anchor = tiny_model(anchor_arch, len(tok), layers=2, width=32, seed=1)
    augment = tiny_model("llama", len(tok), layers=2, width=24, seed=2)
    norm = final_norm(anchor)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        gain = norm.weight + 1 if anchor_arch == "gemma" else norm.weight
        R = torch.randn(32, 24, generator=torch.Generator().manual_seed(3)) / 6
        augment.get_output_embeddings().weight.copy_((anchor.get_output_embeddings().weight * gain) @ R)
    return (anchor, tok), (augment, tok)


@pytest.mark.parametrize("anchor_arch", ["llama", "gemma"])
def test_the_value_path_says_what_the_augmenting_model_would_say(anchor_arch):
    anchor, augment = _pair(anchor_arch)
    calm = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[0, 1], augment_layers=[2, 2], relative=True))
    report = init_value_path(calm, ridge=1e-9)
    assert report["augments"][0]["blocks"] == 2 and report["augments"][0]["relative_residual"] < 1e-3
    text = "the cat sat"
    ids = torch.tensor([anchor[1](text)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(calm.logits(text), anchor[0](ids).logits)  # gates still closed: exactly the anchor
        block = calm.bridge.blocks()[0]
        h = calm.augment_states(0, ids)[0]  # (1, T, 24): the augmenting model's final state
        _, values = block.memory(h)  # (1, heads, T, head_dim)
        value = block.o(values.transpose(1, 2).reshape(1, ids.shape[1], -1))  # one augmenting token, full weight
        said = anchor[0].get_output_embeddings()(final_norm(anchor[0])(value))  # the anchor shown only the value
        meant = augment[0].get_output_embeddings()(block.norm_augment(h))  # what the augmenting model says
    cosine = torch.nn.functional.cosine_similarity(said, meant, dim=-1)
    assert cosine.min() > 0.999
    assert torch.equal(said.argmax(-1), meant.argmax(-1))


def test_answer_tokens_are_fitted_first_and_inner_layers_are_refused():
    g = torch.Generator().manual_seed(0)
    E, U = torch.randn(80, 8, generator=g), torch.randn(80, 12, generator=g)  # 8 dimensions cannot fit 80 tokens
    pairs = [(i, i) for i in range(80)]
    weights = torch.ones(80)
    weights[:5] = 100.0
    plain, weighted = output_map(E, U, pairs), output_map(E, U, pairs, weights)
    error = lambda M: ((E[:5] @ M - U[:5]).norm() / U[:5].norm()).item()  # noqa: E731
    assert error(weighted) < 0.5 * error(plain)

    tok = char_tokenizer()
    anchor = (tiny_model("llama", len(tok), layers=2, width=16, seed=1), tok)
    augment = (tiny_model("llama", len(tok), layers=2, width=24, seed=2), tok)
    calm = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[1], augment_layers=[2]))
    assert init_value_path(calm, answers=["xyz"])["augments"][0]["weighted"] == 3
    inner = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[1], augment_layers=[1]))
    with pytest.raises(CALMError, match="final state"):
        init_value_path(inner)


def test_answer_share_sets_the_weight_that_makes_the_answer_tokens_dominate_the_fit():
    tok = char_tokenizer()
    anchor = (tiny_model("llama", len(tok), layers=2, width=8, seed=1), tok)  # 8 wide: cannot fit every token
    augment = (tiny_model("llama", len(tok), layers=2, width=24, seed=2), tok)
    calm = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[1], augment_layers=[2]))
    reports = {share: init_value_path(calm, answers=["xyz"], answer_share=share)["augments"][0]
               for share in (0.1, 0.5, 0.9)}
    shared, weighted = reports[0.5]["shared_tokens"], reports[0.5]["weighted"]
    assert reports[0.5]["answer_weight"] == pytest.approx((shared - weighted) / weighted, rel=1e-3)
    assert reports[0.9]["answer_weight"] == pytest.approx(9 * reports[0.5]["answer_weight"], rel=1e-3)
    residuals = [reports[s]["answer_residual"] for s in (0.1, 0.5, 0.9)]
    assert residuals[0] > residuals[1] > residuals[2]  # the larger their share, the closer the answers' rows fit
    assert init_value_path(calm, answers=["xyz"], answer_weight=7.0)["augments"][0]["answer_weight"] == 7.0
    assert init_value_path(calm)["augments"][0]["answer_residual"] is None  # no answers: nothing weighted
    with pytest.raises(CALMError, match="answer_share"):
        init_value_path(calm, answers=["xyz"], answer_share=1.0)
