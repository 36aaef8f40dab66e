"""Loading frozen causal LMs and finding their decoder layers, whatever the architecture."""
from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import ModelLoadError

# Where the decoder blocks live, by architecture family; checked before the generic search.
KNOWN_LAYER_PATHS = (
    "model.layers",  # Llama, Qwen2, Mistral, Gemma, Phi, ...
    "transformer.h",  # GPT-2, GPT-Neo, GPT-J, Bloom, Falcon
    "gpt_neox.layers",  # GPT-NeoX, Pythia
    "model.decoder.layers",  # OPT
    "transformer.layers",
    "transformer.blocks",  # MPT
    "model.language_model.layers",  # multimodal wrappers
    "language_model.model.layers",
)


@dataclass(frozen=True)
class ModelInfo:
    """What the app shows about a model and what a saved bridge records about it."""

    name: str
    architecture: str
    num_layers: int
    width: int
    num_heads: int
    num_parameters: int
    vocab_size: int


def _text_config(model: nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _at(model: nn.Module, path: str):
    """model.a.b.c for path "a.b.c", or None where a part is missing."""
    module = model
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's list of decoder blocks; an unknown layout raises a ModelLoadError."""
    for path in KNOWN_LAYER_PATHS:
        module = _at(model, path)
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            return module
    # Generic fallback: the longest ModuleList of identical blocks matching the configured depth.
    expected = getattr(_text_config(model), "num_hidden_layers", None)
    candidates = [
        m
        for m in model.modules()
        if isinstance(m, nn.ModuleList) and len(m) > 0 and len({type(b) for b in m}) == 1
    ]
    if expected is not None:
        candidates = [m for m in candidates if len(m) == expected]
    if candidates:
        return max(candidates, key=len)
    raise ModelLoadError(
        f"Cannot find the decoder layers of a {type(model).__name__} "
        f"(architecture {getattr(model.config, 'architectures', None)}); "
        f"known layouts: {', '.join(KNOWN_LAYER_PATHS)}."
    )


# The norm after the last decoder block (what the output layer reads), by architecture family.
KNOWN_FINAL_NORMS = ("model.norm", "model.final_layernorm", "transformer.ln_f", "gpt_neox.final_layer_norm", "model.decoder.final_layer_norm",
                     "transformer.norm_f", "model.language_model.norm", "language_model.model.norm")


def final_norm(model: nn.Module) -> nn.Module:
    """The module whose output is the model's final hidden state (transformers' hidden_states[-1])."""
    for path in KNOWN_FINAL_NORMS:
        module = _at(model, path)
        if isinstance(module, nn.Module):
            return module
    raise ModelLoadError(f"Cannot find the final norm of a {type(model).__name__}; known: {', '.join(KNOWN_FINAL_NORMS)}.")


def describe(model: nn.Module) -> ModelInfo:
    config = _text_config(model)
    width = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    if width is None or heads is None:
        raise ModelLoadError(f"{type(model).__name__}: its config names no hidden size or head count.")
    return ModelInfo(
        name=str(getattr(model.config, "_name_or_path", "") or type(model).__name__),
        architecture=type(model).__name__,
        num_layers=len(decoder_layers(model)),
        width=int(width),
        num_heads=int(heads),
        num_parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=int(getattr(config, "vocab_size", 0) or 0),
    )


def freeze(model: nn.Module) -> nn.Module:
    """Eval mode, no gradients: CALM never changes a base model's weights."""
    model.eval()
    model.requires_grad_(False)
    return model


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


_locks: "weakref.WeakKeyDictionary[nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """One lock per base model: composed calls add hooks to shared models, so calls that may
    run in other threads (app sessions sharing cached models) take turns."""
    with _locks_guard:
        lock = _locks.get(model)
        if lock is None:
            lock = _locks[model] = threading.RLock()
        return lock


_tokenizers: dict[tuple, object] = {}
_tokenizers_guard = threading.Lock()


def _folder_stamp(folder: Path) -> tuple:
    """What a local tokenizer folder holds, by name, size and modification time: a changed file is a new key."""
    return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in folder.iterdir()
                        if f.is_file() and ("token" in f.name or f.name == "config.json")))


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False):
    """A fast tokenizer, parsed once per local folder and process: Gemma's 262k-token tokenizer.json takes ~4 s
    to parse on 2 cores, and a session, a demo or the suite asks for it many times. The object is shared, so
    callers never set attributes on it (pass `padding_side=` per call instead); hub ids are not cached."""
    from transformers import AutoTokenizer

    folder = Path(name_or_path)
    if not folder.is_dir():
        return AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    key = (os.path.realpath(folder), bool(trust_remote_code), _folder_stamp(folder))
    with _tokenizers_guard:
        if key not in _tokenizers:
            _tokenizers[key] = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
        return _tokenizers[key]


def load_causal_lm(name_or_path: str, dtype=None, trust_remote_code: bool = False, device=None):
    """(model, fast tokenizer) from a local folder, a hub id or a .gguf file (dequantised), frozen."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .gguf_files import is_gguf, load_gguf

    if is_gguf(name_or_path):
        model, tokenizer = load_gguf(name_or_path, dtype=dtype)
        return freeze(model.to(device) if device is not None else model), tokenizer

    try:
        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # OSError, ValueError, HTTP errors: all mean "cannot get it"
        raise ModelLoadError(
            f"Could not load model {name_or_path!r}: not a local folder with a config.json, and "
            f"not reachable as a Hugging Face hub id ({type(exc).__name__}: {exc})."
        ) from exc
    try:
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=dtype, trust_remote_code=trust_remote_code
        )
    except ValueError as exc:
        raise ModelLoadError(
            f"{name_or_path!r} is not a causal language model (architecture "
            f"{getattr(config, 'architectures', None) or config.model_type}): {exc}"
        ) from exc
    except Exception as exc:
        raise ModelLoadError(f"Could not load the weights of {name_or_path!r}: {exc}") from exc
    try:
        tokenizer = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(f"Could not load the tokenizer of {name_or_path!r}: {exc}") from exc
    if device is not None:
        model.to(device)
    return freeze(model), tokenizer
