"""The frozen base models: loading any causal LM (hub id, folder, GGUF file), finding its decoder layers,
merging a LoRA adapter, the offline real pair, and tiny models for tests. Below the engine; imports only errors."""
from .loading import (
                      KNOWN_LAYER_PATHS,
                      ModelInfo,
                      decoder_layers,
                      describe,
                      device_of,
                      final_norm,
                      freeze,
                      load_causal_lm,
                      model_lock,
)

__all__ = ["KNOWN_LAYER_PATHS", "ModelInfo", "decoder_layers", "describe", "device_of", "final_norm", "freeze",
           "load_causal_lm", "model_lock"]
