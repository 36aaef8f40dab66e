"""A peft LoRA adapter merged into a frozen base model: how a preset ships a fine-tuned augmenting model
in megabytes (the adapter) instead of a copy of the model. Only safetensors adapters are read."""
from __future__ import annotations

from pathlib import Path

from ..errors import CALMError


def merge_adapter(model, adapter_dir):
    """The base model with the adapter's low-rank updates added into its weights (plain modules again),
    in eval mode. Raises CALMError for a missing folder, a pickle-only adapter or a missing peft."""
    folder = Path(adapter_dir)
    if not (folder / "adapter_config.json").is_file() or not (folder / "adapter_model.safetensors").is_file():
        raise CALMError(f"{folder} is not a LoRA adapter folder (adapter_config.json + adapter_model.safetensors).")
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise CALMError("This preset's augmenting model is a LoRA adapter, which needs peft: "
                        "pip install -r requirements-real.txt") from exc
    merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    for p in merged.parameters():
        p.requires_grad_(False)
    return merged.eval()
