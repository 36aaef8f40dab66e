"""The engine: a bridge between frozen models and how text flows through it (paper section 3.1).

config (which layers, what shape) -> bridge (projection, cross-attention, tanh gates) -> compose (ComposedLM:
the anchor's layers read the augmenting states through the bridge) -> generation (KV caches for every model).
alignment keeps cross-attention causal across two tokenizers; persistence saves a bridge as JSON + safetensors.
It knows nothing of training or of the app: it imports only calm_core.models and calm_core.errors.
"""
