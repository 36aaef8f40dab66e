"""What a bridge training run is asked to do (TrainConfig: every setting with a default that works, checked on
creation), what it reports (TrainResult), its learning-rate schedule and which parameters each rate applies to."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

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
    # held-out exact match while training (accuracy_probe.py): this many validation examples with short answers,
    # decoded in one batch as often as keeps the decoding within accuracy_share of the run's time; 0: off
    accuracy_examples: int = 32
    accuracy_share: float = 0.1
    accuracy_scoring: str = "exact"  # how answers are compared (evaluation.SCORERS), e.g. a preset's "result"
    checkpoint_every: int = 0  # 0: a checkpoint only at the end (when out_dir is set)
    save_total_limit: int = 0  # checkpoints kept in out_dir/checkpoints, the newest (0: all)
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
        """Every field checked against its type and range (RANGES), with a message that names the field and what
        it allows: a config file or a form can hold anything."""
        for f in fields(self):
            value, kind = getattr(self, f.name), f.type.replace(" | None", "")
            if value is None and "None" in f.type:
                continue
            if kind in ("int", "float") and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                                             (kind == "int" and value != int(value))):
                raise CALMError(f"TrainConfig.{f.name} must be {'a whole number' if kind == 'int' else 'a number'}"
                                f"{_range_text(f.name)}, got {value!r}.")
            if kind == "int" and not isinstance(value, int):
                setattr(self, f.name, int(value))  # 3.0 from a form or a file is 3
            if kind == "bool" and not isinstance(value, bool):
                raise CALMError(f"TrainConfig.{f.name} must be true or false, got {value!r}.")
            if kind == "str" and not isinstance(value, str):
                raise CALMError(f"TrainConfig.{f.name} must be text, got {value!r}.")
            if f.name in RANGES and not _within(value, *RANGES[f.name]):
                raise CALMError(f"TrainConfig.{f.name} must be{_range_text(f.name)}, got {value!r}.")
        from .evaluation import SCORERS
        from .recipes import RECIPES

        for name, allowed in (("method", ("calm", "lora", "finetune")), ("recipe", tuple(RECIPES)),
                              ("accuracy_scoring", tuple(SCORERS))):
            if getattr(self, name) not in allowed:
                raise CALMError(f"TrainConfig.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}.")
        if self.batch_size % self.grad_accum:
            raise CALMError(f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}.")


# (lowest, highest, lowest excluded) per numeric field; None: no bound on that side
RANGES = {
    "steps": (1, None, False), "lr": (0, None, True), "batch_size": (1, None, False), "grad_accum": (1, None, False),
    "warmup_steps": (0, None, False), "weight_decay": (0, 1, False), "gate_lr_scale": (0, None, True),
    "position_lr_scale": (0, None, True), "value_lr_scale": (0, None, False), "grad_clip": (0, None, False),
    "augment_noise": (0, None, False), "log_every": (1, None, False), "eval_every": (1, None, False),
    "eval_examples": (0, None, False), "accuracy_examples": (0, 4096, False), "accuracy_share": (0, 1, True),
    "checkpoint_every": (0, None, False), "save_total_limit": (0, None, False), "seed": (0, 2**63 - 1, False), "max_length": (1, None, False),
    "cache_budget_mb": (0, None, False),
}


def _within(value, low, high, low_open) -> bool:
    return math.isfinite(value) and (low is None or value > low or (value == low and not low_open)) and (
        high is None or value <= high)


def _range_text(name: str) -> str:
    if name not in RANGES:
        return ""
    low, high, low_open = RANGES[name]
    if high is None:
        return f" {'>' if low_open else '>='} {low}"
    return f" in {'(' if low_open else '['}{low}, {high}]"


@dataclass
class TrainResult:
    step: int
    history: list[dict] = field(default_factory=list)
    stop_reason: str = "finished"  # "finished", "stopped" or "diverged"
    message: str = ""
    truncated: int = 0
    augment_cache: bool = False
    accuracy_note: str = ""  # the held-out exact match at the end, and what checking it cost (accuracy_probe.py)
    cache_note: str = ""  # why the frozen models' states were or were not cached (their size against the budget)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup to 1, then cosine decay to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
