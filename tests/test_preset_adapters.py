"""Presets that name the real pair instead of shipping models, and LoRA adapters merged into an augmenting
model (the real-knowledge preset's m_A). Tiny models stand in for the real pair: the folders and markers are
what `prepared_pair` reads."""
import json

import pytest
import torch

from calm_core import CALMConfig, CALMError, ComposedLM
from calm_core.lab.presets import list_presets, load_preset
from calm_core.lab.session import LabSession, ModelCache
from calm_core.models.real_pair import MARKER, MODELS, PREPARE_COMMAND, model_dir
from calm_core.models.tiny import char_tokenizer, tiny_model

peft = pytest.importorskip("peft")


def _adapter(model, folder, seed=3):
    """A LoRA adapter with non-zero updates (B starts at zero in peft: set it), saved as safetensors."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    wrapped = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    wrapped.save_pretrained(str(folder))
    return wrapped


@pytest.fixture
def fake_pair(tmp_path, monkeypatch):
    """Tiny models in the real pair's folders (smollm2: a gpt2, gemma: a llama), with their markers."""
    root = tmp_path / "pair"
    tok = char_tokenizer()
    for key, arch, seed in (("smollm2", "gpt2", 1), ("gemma", "llama", 2)):
        folder = model_dir(key, root)
        tiny_model(arch, len(tok), layers=2, width=32, seed=seed).save_pretrained(folder)
        tok.save_pretrained(folder)
        (folder / MARKER).write_text(json.dumps({"sha256": MODELS[key][2].sha256}))  # as prepare() writes it
    monkeypatch.setenv("CALM_REAL_PAIR_DIR", str(root))
    return root


def _write_preset(root, fake_pair, name="world"):
    folder = root / name
    folder.mkdir(parents=True)
    tok = char_tokenizer()
    gemma = tiny_model("llama", len(tok), layers=2, width=32, seed=2)
    _adapter(gemma, folder / "adapter")
    from calm_core import load_causal_lm
    from calm_core.models.adapters import merge_adapter

    anchor = load_causal_lm(str(model_dir("smollm2", fake_pair)))
    m_a = (merge_adapter(load_causal_lm(str(model_dir("gemma", fake_pair)))[0], folder / "adapter"), tok)
    ComposedLM(anchor, [m_a], CALMConfig(every=1, null_slot=True)).save_pretrained(folder / "bridge")
    (folder / "data").mkdir()
    (folder / "data" / "composition_train.jsonl").write_text(json.dumps({"prompt": "ab=", "completion": "ba"}) + "\n")
    (folder / "preset.json").write_text(json.dumps({
        "title": "A world", "description": "tiny", "anchor_model": "real_pair:smollm2", "augment_model": "real_pair:gemma",
        "augment_adapter": "adapter", "question_forms": {"town": ["{x} was born in which town?"]}}))
    return folder


def test_merged_adapter_equals_the_peft_model_and_is_frozen(tmp_path):
    from calm_core.models.adapters import merge_adapter

    tok = char_tokenizer()
    wrapped = _adapter(tiny_model("llama", len(tok), layers=2, width=32, seed=2), tmp_path / "a")
    ids = torch.tensor([tok("abcabc")["input_ids"]])
    with torch.no_grad():
        want = wrapped(ids).logits
    merged = merge_adapter(tiny_model("llama", len(tok), layers=2, width=32, seed=2), tmp_path / "a")
    with torch.no_grad():
        got = merged(ids).logits
        plain = tiny_model("llama", len(tok), layers=2, width=32, seed=2)(ids).logits
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, plain, atol=1e-3)
    assert not any(p.requires_grad for p in merged.parameters()) and not merged.training
    assert not any("lora" in n for n, _ in merged.named_modules())


@pytest.mark.parametrize("files", [[], ["adapter_config.json"], ["adapter_config.json", "adapter_model.bin"]])
def test_an_adapter_folder_needs_its_config_and_safetensors(tmp_path, files):
    from calm_core.models.adapters import merge_adapter

    for name in files:
        (tmp_path / name).write_text("{}")
    with pytest.raises(CALMError, match="not a LoRA adapter folder"):
        merge_adapter(tiny_model("llama", 40, layers=1, width=16), tmp_path)


def test_the_cache_keeps_a_model_with_an_adapter_apart_from_the_plain_one(tmp_path, fake_pair):
    gemma = str(model_dir("gemma", fake_pair))
    _adapter(tiny_model("llama", len(char_tokenizer()), layers=2, width=32, seed=2), tmp_path / "a")
    cache = ModelCache()
    plain, adapted = cache.get(gemma), cache.get(gemma, adapter=tmp_path / "a")
    assert plain[0] is not adapted[0] and cache.get(gemma)[0] is plain[0]
    assert cache.get(gemma, adapter=tmp_path / "a")[0] is adapted[0]
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert not torch.allclose(plain[0](ids).logits, adapted[0](ids).logits, atol=1e-3)


def test_a_real_pair_preset_is_listed_only_where_the_pair_is_prepared(tmp_path, fake_pair, monkeypatch):
    presets = tmp_path / "presets"
    _write_preset(presets, fake_pair)
    assert list_presets(presets) == ["world"]
    preset = load_preset("world", presets)
    assert preset.anchor == model_dir("smollm2", fake_pair) and preset.augments == [model_dir("gemma", fake_pair)]
    assert preset.augment_adapters == [presets / "world" / "adapter"]
    assert preset.question_forms == {"town": ["{x} was born in which town?"]}
    monkeypatch.setenv("CALM_REAL_PAIR_DIR", str(tmp_path / "nothing"))
    monkeypatch.setattr("calm_core.models.real_pair.prepares_at_first_use", lambda: True)
    assert list_presets(presets) == ["world"]  # not prepared, but using it prepares it (LabSession.use_preset)
    monkeypatch.setattr("calm_core.models.real_pair.prepares_at_first_use", lambda: False)
    assert list_presets(presets) == []
    with pytest.raises(CALMError, match=PREPARE_COMMAND):
        load_preset("world", presets)


@pytest.mark.parametrize("key,value", [("anchor_model", "real_pair:llama"), ("augment_model", "hub/some-model")])
def test_a_preset_naming_an_unknown_model_is_refused(tmp_path, fake_pair, key, value):
    presets = tmp_path / "presets"
    folder = _write_preset(presets, fake_pair)
    meta = json.loads((folder / "preset.json").read_text())
    meta[key] = value
    (folder / "preset.json").write_text(json.dumps(meta))
    with pytest.raises(CALMError, match="real-pair model"):
        load_preset("world", presets)
    assert set(MODELS) == {"gemma", "smollm2"}


def test_the_lab_composes_a_real_pair_preset_with_its_adapter(tmp_path, fake_pair, monkeypatch):
    presets = tmp_path / "presets"
    folder = _write_preset(presets, fake_pair)
    monkeypatch.setattr("calm_core.lab.presets.PRESETS_DIR", presets)
    session = LabSession(ModelCache())
    session.use_preset("world")
    assert session.preset is not None and session.preset.name == "world"
    from calm_core import load_causal_lm
    from calm_core.models.adapters import merge_adapter

    tok = char_tokenizer()
    m_a = (merge_adapter(load_causal_lm(str(model_dir("gemma", fake_pair)))[0], folder / "adapter"), tok)
    expected = ComposedLM.from_pretrained(folder / "bridge", anchor=load_causal_lm(str(model_dir("smollm2", fake_pair))),
                                          augments=[m_a])
    ids = torch.tensor([tok("abcab")["input_ids"]])
    with torch.no_grad():
        want = expected.augments[0].model(ids).logits
        got = session.calm.augments[0].model(ids).logits
    assert torch.allclose(got, want, atol=1e-6)
    assert session.calm.generate("ab=", max_new_tokens=3) == expected.generate("ab=", max_new_tokens=3)
    assert "The made-up world" not in session.preset.story_markdown()  # no world.json in this one
