"""Training and scoring a bridge: data files -> examples -> batches -> the Trainer (AdamW on the bridge only,
frozen-state cache, resumable checkpoints) -> evaluation as the paper's tables do it. Imports the engine and
the models, never the lab or the app."""
from .config import TrainConfig, TrainResult, lr_factor, parameter_role
from .data import DataConfig, DataError, DataSplits, Example, load_examples, load_splits
from .trainer import Trainer

__all__ = ["DataConfig", "DataError", "DataSplits", "Example", "TrainConfig", "TrainResult", "Trainer",
           "load_examples", "load_splits", "lr_factor", "parameter_role"]
