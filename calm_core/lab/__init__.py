"""The lab: one user's experiment behind one object (LabSession), with everything a shared server needs around it:
the bounds of every field, the memory ledger, the process-wide model cache, presets, bridge files and figures.
The app (calm_app) talks to this layer only."""
from .model_cache import MODEL_CACHE, ModelCache
from .session import LabSession, RunState, layer_labels, model_rows, short_name

__all__ = ["MODEL_CACHE", "LabSession", "ModelCache", "RunState", "layer_labels", "model_rows", "short_name"]
