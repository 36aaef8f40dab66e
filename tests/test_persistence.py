"""Saving the bridge alone (JSON + safetensors) and loading it back, or refusing to."""
import json

import pytest
import torch

from calm_core import CALMConfig, CALMError, ComposedLM, IncompatibleBridgeError

from .conftest import make_pair, randomize_bridge


def test_round_trip_gives_identical_logits(composed, tmp_path, capsys):
    randomize_bridge(composed)
    composed.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bridge.safetensors", "bridge_config.json"]
    description = json.loads((tmp_path / "bridge_config.json").read_text())
    assert description["config"]["every"] == 2 and description["anchor"]["width"] == 32
    assert description["augments"][0]["layer_pairs"] == [[1, 1], [3, 3]]
    anchor = (composed.anchor.model, composed.anchor.tokenizer)
    augment = (composed.augments[0].model, composed.augments[0].tokenizer)
    loaded = ComposedLM.from_pretrained(tmp_path, anchor=anchor, augments=[augment])
    with torch.no_grad():
        assert torch.equal(loaded.logits(["hello world"]), composed.logits(["hello world"]))
    loaded.print_trainable_parameters()
    assert capsys.readouterr().out.startswith("trainable params: ")


def test_round_trip_of_a_bridge_with_every_option(tokenizers, tmp_path):
    anchor = make_pair("llama", tokenizers["char_bos"], layers=2, width=32, seed=1)
    augment = make_pair("gpt2", tokenizers["char_bos"], layers=2, width=16, heads=2, seed=2)
    config = CALMConfig(anchor_layers=[0], augment_layers=[1], gate="scalar", insert="before", recency=3, null_slot=True,
                        window=2)
    calm = randomize_bridge(ComposedLM(anchor, [augment], config))
    calm.save_pretrained(tmp_path)
    loaded = ComposedLM.from_pretrained(tmp_path, anchor=anchor, augments=[augment])
    assert loaded.config == config
    with torch.no_grad():
        assert torch.equal(loaded.logits(["hello world"]), calm.logits(["hello world"]))


def test_the_weights_file_is_plain_safetensors(composed, tmp_path):
    from safetensors import safe_open

    composed.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "bridge.safetensors"), "pt") as f:
        assert set(f.keys()) == set(composed.bridge.state_dict())


@pytest.mark.parametrize("change, message", [
    (dict(width=48), "anchor has width 48 but the bridge was made for 32"),
    (dict(layers=2), "anchor has num_layers 2 but the bridge was made for 4"),
    (dict(augment_width=32), "augmenting model 0 has width 32 but the bridge was made for 24"),
])
def test_loading_onto_other_models_says_what_differs(composed, tokenizers, tmp_path, change, message):
    composed.save_pretrained(tmp_path)
    anchor = make_pair("gpt2", tokenizers["char_bos"], layers=change.get("layers", 4), width=change.get("width", 32))
    augment = make_pair("llama", tokenizers["bpe"], layers=4, width=change.get("augment_width", 24))
    with pytest.raises(IncompatibleBridgeError, match=message):
        ComposedLM.from_pretrained(tmp_path, anchor=anchor, augments=[augment])


def test_missing_or_broken_files(composed, tmp_path):
    with pytest.raises(CALMError, match="bridge_config.json is missing"):
        ComposedLM.from_pretrained(tmp_path, anchor=(composed.anchor.model, composed.anchor.tokenizer))
    composed.save_pretrained(tmp_path)
    (tmp_path / "bridge.safetensors").unlink()
    with pytest.raises(CALMError, match="bridge.safetensors is missing"):
        ComposedLM.from_pretrained(tmp_path, anchor=(composed.anchor.model, composed.anchor.tokenizer))


def test_from_pretrained_loads_the_models_it_names(tokenizers, tmp_path):
    anchor, augment = make_pair("gpt2", tokenizers["char_bos"], seed=1), make_pair("opt", tokenizers["bpe"], seed=2)
    for name, (model, tok) in {"anchor": anchor, "augment": augment}.items():
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    calm = randomize_bridge(ComposedLM.from_names(str(tmp_path / "anchor"), [str(tmp_path / "augment")], CALMConfig(every=1)))
    calm.save_pretrained(tmp_path / "bridge")
    again = ComposedLM.from_pretrained(tmp_path / "bridge")
    with torch.no_grad():
        torch.testing.assert_close(again.logits(["hello"]), calm.logits(["hello"]))


def test_unknown_model_gets_a_clear_error(tmp_path):
    from calm_core import ModelLoadError

    with pytest.raises(ModelLoadError, match="Could not load model"):
        ComposedLM.from_names(str(tmp_path / "nothing-here"), [str(tmp_path / "nor-here")])


def test_a_moved_folder_still_finds_its_models(tokenizers, tmp_path):
    import shutil

    anchor, augment = make_pair("gpt2", tokenizers["char_bos"], seed=1), make_pair("llama", tokenizers["bpe"], seed=2)
    for name, (model, tok) in {"anchor": anchor, "augment": augment}.items():
        model.save_pretrained(tmp_path / "a" / name)
        tok.save_pretrained(tmp_path / "a" / name)
    calm = ComposedLM.from_names(str(tmp_path / "a" / "anchor"), [str(tmp_path / "a" / "augment")], CALMConfig(every=1))
    calm.save_pretrained(tmp_path / "a" / "bridge")
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = ComposedLM.from_pretrained(tmp_path / "b" / "bridge")
    assert moved.anchor.info.name == str((tmp_path / "b" / "anchor").resolve())


def test_sixteen_bit_models_with_a_float32_bridge(tokenizers, tmp_path):
    for name, (model, tok) in {"anchor": make_pair("qwen2", tokenizers["char_bos"], seed=1),
                               "augment": make_pair("gpt2", tokenizers["bpe"], seed=2)}.items():
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    calm = randomize_bridge(ComposedLM.from_names(str(tmp_path / "anchor"), [str(tmp_path / "augment")],
                                                  CALMConfig(every=1), dtype=torch.bfloat16))
    assert calm.anchor.model.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in calm.bridge.parameters())
    logits = calm.logits(["hello world"])
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    assert isinstance(calm.generate("hello", max_new_tokens=3), str)
