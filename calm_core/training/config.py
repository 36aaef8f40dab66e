"""What a bridge training run is asked to do (TrainConfig: every setting with a default that works, checked on
creation), what it reports (TrainResult), its learning-rate schedule and which parameters each rate applies to."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import CALMError


def parameter_role(name: str) -> str:
    """Which learning-rate group a bridge parameter belongs to: "gate", "position" (recency biases, null keys),
    "value" (the projection, value and output maps) or "other" (queries, keys, norms)."""
    module, _, leaf = name.rpartition(".")
    if leaf in _LEAF_ROLES:
        return _LEAF_ROLES[leaf]
    return "value" if module.rpartition(".")[2] in ("proj", "v", "o") else "other"


_LEAF_ROLES = {"gate": "gate", "recency": "position", "null_key": "position"}


@dataclass
class TrainConfig:
    """Bridge training settings; the defaults train a small bridge on a CPU in minutes."""

    steps: int = 200
    lr: float = 1e-3
    batch_size: int = 16  # examples per optimizer step, over all processes and accumulation steps
    grad_accum: int = 1
    warmup_steps: int = 20
    weight_decay: float = 0.0
    gate_lr_scale: float = 1.0  # the tanh gates' learning rate is lr * gate_lr_scale (a closed gate opens slowly)
    # the same for the attention's recency biases and null keys: they start at 0 and must reach several units
    # before attention picks one augmenting position, which at lr 1e-3 takes thousands of steps
    position_lr_scale: float = 1.0
    # the value path (projection, value and output maps; the projection also feeds the keys): 0 keeps it as it
    # started, e.g. as calm_core.vocab_init's map between vocabularies, so that it carries tokens that the
    # training data never shows, and only where to attend (and how much to let through) is learned
    value_lr_scale: float = 1.0
    grad_clip: float = 1.0
    augment_noise: float = 0.0  # Gaussian noise on the augmenting states while training, relative to their RMS
    log_every: int = 10
    eval_every: int = 50
    eval_examples: int = 256
    checkpoint_every: int = 0  # 0: a checkpoint only at the end (when out_dir is set)
    seed: int = 0
    bf16: bool = False
    max_length: int | None = None
    append_eos: bool = True
    cache_augment_states: bool = True  # store the augmenting states and the anchor below the bridge per example, once
    cache_budget_mb: float | None = None  # None: what memory allows (half the free memory; in the lab, the ledger's)
    out_dir: str | None = None
    progress: bool = True
    # what is trained: "calm" the bridge; "lora" / "finetune" the anchor itself with as many trainable parameters
    # as the bridge (baselines.py): the paper's comparison, on the same data, loss and schedule
    method: str = "calm"
    # how a new bridge starts (recipes.py: "plain", "knowledge"); its learning-rate scales are the fields above,
    # which LabSession.train_config and the CLI fill from the recipe unless given
    recipe: str = "plain"

    def __post_init__(self):
        for name in ("steps", "batch_size", "grad_accum", "log_every", "eval_every"):
            if getattr(self, name) < 1:
                raise CALMError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.lr <= 0:
            raise CALMError(f"TrainConfig.lr must be > 0, got {self.lr}.")
        if not math.isfinite(self.augment_noise) or self.augment_noise < 0:
            raise CALMError(f"TrainConfig.augment_noise must be >= 0, got {self.augment_noise}.")
        for name in ("gate_lr_scale", "position_lr_scale"):
            if not getattr(self, name) > 0:
                raise CALMError(f"TrainConfig.{name} must be > 0, got {getattr(self, name)}.")
        if not (math.isfinite(self.value_lr_scale) and self.value_lr_scale >= 0):
            raise CALMError(f"TrainConfig.value_lr_scale must be >= 0, got {self.value_lr_scale}.")
        if self.method not in ("calm", "lora", "finetune"):
            raise CALMError(f"TrainConfig.method must be 'calm', 'lora' or 'finetune', got {self.method!r}.")
        from .recipes import RECIPES

        if self.recipe not in RECIPES:
            raise CALMError(f"TrainConfig.recipe must be one of {', '.join(RECIPES)}, got {self.recipe!r}.")
        if self.batch_size % self.grad_accum:
            raise CALMError(f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}.")


@dataclass
class TrainResult:
    step: int
    history: list[dict] = field(default_factory=list)
    stop_reason: str = "finished"  # "finished", "stopped" or "diverged"
    message: str = ""
    truncated: int = 0
    augment_cache: bool = False
    cache_note: str = ""  # why the frozen models' states were or were not cached (their size against the budget)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup to 1, then cosine decay to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
