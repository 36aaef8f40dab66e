"""calm_core: compose frozen causal LMs with a trained gated cross-attention bridge (CALM, ICLR 2024).

Layers, lowest first (import-linter keeps them, see .importlinter): errors -> models -> engine -> training -> lab
-> cli. docs/architecture.md draws them."""
from . import _old_paths
from .engine.alignment import Encoding
from .engine.bridge import Bridge, GatedCrossAttention
from .engine.compose import ComposedBatch, ComposedLM
from .engine.config import CALMConfig
from .engine.generation import GenerationResult, Sampling
from .engine.inspection import AttentionRecord
from .errors import CALMError, IncompatibleBridgeError, ModelLoadError
from .models.loading import ModelInfo, decoder_layers, describe, load_causal_lm
from .training.config import TrainConfig, TrainResult
from .training.trainer import Trainer

_old_paths.install()

__all__ = [
    "AttentionRecord", "Bridge", "CALMConfig", "CALMError", "ComposedBatch", "ComposedLM", "Encoding",
    "GatedCrossAttention", "GenerationResult", "IncompatibleBridgeError", "ModelInfo", "ModelLoadError",
    "Sampling", "TrainConfig", "TrainResult", "Trainer", "decoder_layers", "describe", "load_causal_lm",
]
