"""Reading a GGUF file (llama.cpp, Ollama) as an ordinary float model with its tokenizer.

transformers' GGUF reader dequantises every tensor to float32 but leaves a quantization_config on
the model, which then refuses save_pretrained and keeps quantizer hooks around. We rebuild the
model from its config without it and hand over the dequantised weights, so a GGUF model behaves
exactly like one loaded from a folder (and can be saved as one: see calm_core.real_pair).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from ..errors import ModelLoadError

GGUF_HELP = "install it with `pip install gguf` (the reader transformers uses), then load the file again"


def is_gguf(name_or_path) -> bool:
    return str(name_or_path).lower().endswith(".gguf")


def load_gguf(path, dtype=None):
    """(model, fast tokenizer) from a .gguf file, dequantised; dtype defaults to float32."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"No GGUF file at {str(path)!r}.")
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"Reading {path.name} needs the `gguf` package, which is not installed: {GGUF_HELP}.")
    folder, name = str(path.parent), path.name
    try:
        AutoConfig.from_pretrained(folder, gguf_file=name)  # reads the header only: an unknown architecture fails here, clearly
    except Exception as exc:  # ValueError "architecture X is not supported", a corrupt header, ...
        raise ModelLoadError(
            f"transformers cannot read {path.name} ({type(exc).__name__}: {exc}). Its GGUF reader knows only some "
            f"architectures (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, GPT-2, ...); for another one, load the "
            f"model's original folder or hub id instead, or convert it with llama.cpp's convert scripts."
        ) from exc
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as exc:
        raise ModelLoadError(f"Could not read the weights or tokenizer in {path.name}: {type(exc).__name__}: {exc}") from exc
    model = _plain_copy(loaded)
    model.config._name_or_path = str(path)
    if dtype is not None:
        model.to(dtype)
    return model, tokenizer


def _plain_copy(loaded):
    """The same network built from its config without quantization_config, holding the loaded weights."""
    from transformers import AutoModelForCausalLM

    plain = loaded.config.__class__.from_dict(
        {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
    )
    model = AutoModelForCausalLM.from_config(plain, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [m for m in missing if not _tied(model, m)]
    if missing or unexpected:
        raise ModelLoadError(f"The GGUF file's tensors do not match the {type(model).__name__} its header describes "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]}).")
    model.generation_config = loaded.generation_config
    return model


def _tied(model, name: str) -> bool:
    """An output embedding tied to the input one is not in the state dict on its own."""
    output = model.get_output_embeddings()
    return (getattr(model.config, "tie_word_embeddings", False) and output is not None
            and name.startswith("lm_head") and output.weight is model.get_input_embeddings().weight)
