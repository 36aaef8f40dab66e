"""An augmenting model's final hidden state (after its final norm) as a composition layer: augment layer index
== its depth. Real models such as Gemma carry huge constant activations in a few channels of every inner layer;
the final state is what the output layer reads and has none."""
import pytest
import torch

from calm_core import CALMConfig, CALMError, ComposedLM
from calm_core.models.loading import final_norm
from calm_core.models.tiny import ARCHITECTURES, char_tokenizer, tiny_model

from .conftest import randomize_bridge


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_index_past_the_last_layer_is_the_final_hidden_state(arch):
    tok = char_tokenizer()
    anchor = (tiny_model("llama", len(tok), layers=2, width=32, seed=1), tok)
    augment = (tiny_model(arch, len(tok), layers=3, width=32, seed=2), tok)
    calm = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[0, 1], augment_layers=[3, 1]))
    ids = torch.tensor([tok("abcab")["input_ids"]])
    with torch.no_grad():
        want = augment[0](ids, output_hidden_states=True).hidden_states
    final, middle = calm.augment_states(0, ids)
    assert torch.allclose(final, want[-1], atol=1e-6)  # transformers' hidden_states[-1]: after the final norm
    assert torch.allclose(middle, want[2], atol=1e-6)  # layer 1's output
    assert final_norm(augment[0]) is not None


def test_closed_gates_stay_exact_and_the_bridge_round_trips(tmp_path):
    tok = char_tokenizer()
    anchor = (tiny_model("gpt2", len(tok), layers=2, width=32, seed=1), tok)
    augment = (tiny_model("gemma", len(tok), layers=2, width=32, seed=2), tok)
    calm = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[0, 1], augment_layers=[2, 2], null_slot=True))
    text = "abc abc"
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(calm.logits(text), anchor[0](ids).logits)
    randomize_bridge(calm)
    calm.save_pretrained(tmp_path / "b")
    again = ComposedLM.from_pretrained(tmp_path / "b", anchor=anchor, augments=[augment])
    assert again.config.augment_layers == [2, 2]
    assert torch.allclose(again.logits(text), calm.logits(text), atol=1e-6)


@pytest.mark.parametrize("config", [dict(anchor_layers=[0], augment_layers=[3]), dict(anchor_layers=[2], augment_layers=[0])])
def test_one_past_the_last_layer_is_only_for_the_augmenting_model_and_no_further(config):
    tok = char_tokenizer()
    anchor = (tiny_model("gpt2", len(tok), layers=2, width=32, seed=1), tok)
    augment = (tiny_model("llama", len(tok), layers=2, width=32, seed=2), tok)
    with pytest.raises(CALMError, match="outside"):
        ComposedLM(anchor, [augment], CALMConfig(**config))
