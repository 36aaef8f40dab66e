"""CALMConfig(relative=True): each block writes in units of the RMS of the anchor state it is added to."""
import torch

from calm_core import CALMConfig, ComposedLM
from calm_core.engine.bridge import GatedCrossAttention
from calm_core.models.tiny import char_tokenizer, tiny_model

from .conftest import randomize_bridge


def test_the_output_follows_the_scale_of_the_anchor_stream():
    torch.manual_seed(0)
    block = GatedCrossAttention(16, 32, 4, relative=True)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    anchor, augment = torch.randn(2, 5, 32), torch.randn(2, 7, 16)
    visible = torch.ones(2, 5, 7, dtype=torch.bool)
    memory = block.memory(augment)
    small, large = block(anchor, memory, visible), block(anchor * 10, memory, visible)
    assert torch.allclose(large, small * 10, atol=1e-4)  # the anchor LayerNorm makes the query scale-free
    absolute = GatedCrossAttention(16, 32, 4)
    absolute.load_state_dict(block.state_dict())
    with torch.no_grad():
        rms = anchor.pow(2).mean(-1, keepdim=True).sqrt()
        assert torch.allclose(small, absolute(anchor, memory, visible) * rms, atol=1e-5)


def test_closed_gates_stay_exact_and_the_setting_round_trips(tmp_path):
    tok = char_tokenizer()
    anchor = (tiny_model("llama", len(tok), layers=2, width=32, seed=1), tok)
    augment = (tiny_model("gpt2", len(tok), layers=2, width=32, seed=2), tok)
    calm = ComposedLM(anchor, [augment], CALMConfig(every=1, relative=True))
    ids = torch.tensor([tok("abc abc")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(calm.logits("abc abc"), anchor[0](ids).logits)
    randomize_bridge(calm)
    calm.save_pretrained(tmp_path / "b")
    again = ComposedLM.from_pretrained(tmp_path / "b", anchor=anchor, augments=[augment])
    assert again.config.relative and torch.allclose(again.logits("abc abc"), calm.logits("abc abc"), atol=1e-6)
