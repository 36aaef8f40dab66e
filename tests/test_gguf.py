"""GGUF files load wherever a model is named: dequantised, as plain models that save and compose."""
import importlib.util

import pytest
import torch

from calm_core import CALMConfig, ComposedLM, ModelLoadError, gguf_files, load_causal_lm

from .conftest import CORPUS

pytest.importorskip("gguf", reason="the gguf package is in requirements.txt")


@pytest.fixture
def tiny_gguf(tmp_path, tokenizers):
    from .gguf_fixtures import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path / "tiny-llama.gguf", tokenizers["bpe"])


def test_a_gguf_file_loads_as_a_plain_frozen_model(tiny_gguf, tokenizers, tmp_path):
    model, tokenizer = load_causal_lm(str(tiny_gguf))
    assert type(model).__name__ == "LlamaForCausalLM" and not hasattr(model.config, "quantization_config")
    assert not any(p.requires_grad for p in model.parameters()) and not model.training
    for text in CORPUS[:3]:  # the BPE vocabulary and merges came through
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == tokenizers["bpe"](text)["input_ids"]
    model.save_pretrained(tmp_path / "folder")  # refused by transformers while a quantization_config remains
    tokenizer.save_pretrained(tmp_path / "folder")
    again, _ = load_causal_lm(str(tmp_path / "folder"))
    ids = torch.tensor([tokenizer("hello world")["input_ids"]])
    assert torch.equal(again(ids).logits, model(ids).logits)


def test_gguf_models_compose_by_name(tiny_gguf):
    calm = ComposedLM.from_names(str(tiny_gguf), [str(tiny_gguf)], CALMConfig(every=1))
    batch = calm.encode(["the quick brown fox"])
    assert torch.equal(calm.forward(batch), calm.anchor.model(input_ids=batch.anchor.input_ids).logits)
    assert calm.anchor.info.name.endswith("tiny-llama.gguf")


@pytest.mark.parametrize("case, expected", [
    ("missing file", "No GGUF file"),
    ("no gguf package", "pip install gguf"),
    ("unknown architecture", "notamodel"),
])
def test_gguf_failures_say_what_to_do(tmp_path, monkeypatch, case, expected):
    from .gguf_fixtures import write_unknown_architecture_gguf

    path = tmp_path / "model.gguf"
    if case == "no gguf package":
        path.write_bytes(b"GGUF")
        real = importlib.util.find_spec
        monkeypatch.setattr(gguf_files.importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    elif case == "unknown architecture":
        write_unknown_architecture_gguf(path)
    with pytest.raises(ModelLoadError, match=expected):
        load_causal_lm(str(path))


def test_a_folders_tokenizer_is_parsed_once_and_again_when_its_files_change(tmp_path):
    """load_tokenizer: Gemma's tokenizer.json takes ~4 s to parse; a folder's tokenizer is shared in the process
    until one of its files changes (size or modification time)."""
    import os

    from calm_core.models.loading import load_tokenizer
    from calm_core.models.tiny import bpe_tokenizer

    bpe_tokenizer(CORPUS, vocab_size=300).save_pretrained(tmp_path)
    first = load_tokenizer(str(tmp_path))
    assert load_tokenizer(str(tmp_path)) is first and load_tokenizer(str(tmp_path) + "/") is first
    config = tmp_path / "tokenizer_config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    again = load_tokenizer(str(tmp_path))
    assert again is not first and again("the fox")["input_ids"] == first("the fox")["input_ids"]
