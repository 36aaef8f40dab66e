"""calm_core: compose frozen causal LMs with a trained gated cross-attention bridge (CALM, ICLR 2024)."""
from .alignment import Encoding
from .bridge import Bridge, GatedCrossAttention
from .compose import AttentionRecord, ComposedBatch, ComposedLM
from .config import CALMConfig
from .errors import CALMError, IncompatibleBridgeError, ModelLoadError
from .generation import GenerationResult, Sampling
from .models import ModelInfo, decoder_layers, describe, load_causal_lm

__all__ = [
    "AttentionRecord", "Bridge", "CALMConfig", "CALMError", "ComposedBatch", "ComposedLM", "Encoding",
    "GatedCrossAttention", "GenerationResult", "IncompatibleBridgeError", "ModelInfo", "ModelLoadError",
    "Sampling", "decoder_layers", "describe", "load_causal_lm",
]
