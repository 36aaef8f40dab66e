"""Base models loaded once per process and shared read-only by every session, on the GPU when
there is one (bf16 where it is supported), after a check that they fit."""
from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import torch

from ..errors import CALMError
from ..models.devices import default_device, default_dtype, fast_bf16  # noqa: F401 (used here and by callers)
from ..models.loading import load_causal_lm
from .resources import GB, available_bytes


class ModelCache:
    """Loaded (model, tokenizer) pairs by name, least recently used dropped first."""

    def __init__(self, max_models: int = 6):
        self.max_models, self._models, self._lock = max_models, OrderedDict(), threading.Lock()

    def get(self, name: str, dtype=None, trust_remote_code: bool = False, device: str | None = None,
            adapter: str | Path | None = None):
        """`adapter`: a LoRA folder merged into this copy of the model (cached apart from the plain model)."""
        device = device or default_device()
        key = (str(name), str(dtype), trust_remote_code, device, str(adapter) if adapter else None)
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            check_memory(str(name), dtype, device)
            try:
                pair = load_causal_lm(str(name), dtype=dtype, trust_remote_code=trust_remote_code, device=device)
                if adapter:
                    from ..models.adapters import merge_adapter

                    pair = (merge_adapter(pair[0], adapter), pair[1])
            except (MemoryError, torch.OutOfMemoryError) as exc:
                raise CALMError(f"{name} does not fit in this machine's memory; choose a smaller model.") from exc
            self._models[key] = pair
            while len(self._models) > self.max_models:
                self._models.popitem(last=False)
            return pair


def estimated_weight_bytes(name: str, dtype=None) -> int:
    """Weights from the model's config alone (0 when there is none to read)."""
    from ..models.gguf_files import is_gguf

    try:
        from transformers import AutoConfig

        if is_gguf(name):  # its header has the config; reading it dequantises to float32, then copies once
            path = Path(name).expanduser()
            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).get_text_config()
            dtype = None
        else:
            config = AutoConfig.from_pretrained(name).get_text_config()
    except Exception:
        return 0  # loading will report what is wrong
    width = getattr(config, "hidden_size", 0) or 0
    layers = getattr(config, "num_hidden_layers", 0) or 0
    vocab = getattr(config, "vocab_size", 0) or 0
    params = 12 * layers * width * width + 2 * vocab * width
    return params * (2 if dtype in (torch.bfloat16, torch.float16) else 4)


def check_memory(name: str, dtype=None, device: str = "cpu") -> None:
    """Refuse a model whose weights alone would not fit in the free memory, before loading it."""
    need = estimated_weight_bytes(name, dtype)
    free = available_bytes(device)
    if need > 0.8 * free:
        raise CALMError(f"{name} needs about {need / GB:.1f} GB for its weights but only {free / GB:.1f} GB "
                        f"are free; choose a smaller model or a 16-bit dtype.")


MODEL_CACHE = ModelCache()
