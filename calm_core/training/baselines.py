"""The paper's comparison: the anchor itself trained on the composition data, with as many trainable parameters as
the bridge. "lora": a peft LoRA on the anchor's linear layers, its rank chosen so that its parameter count matches
the bridge's; "finetune": the anchor's own weights from its top layer down, until the budget is spent.

An AnchorBaseline stands where a ComposedLM stands (no augmenting model), so the same Trainer trains it on the
same rows, loss, schedule and rehearsal targets as the bridge. It trains a copy of the anchor: the shared base
model is never changed, and `gate_scale(0)` runs that untouched anchor (the reference of keep_anchor rows, and
the "anchor alone" of a comparison). Saved as JSON + safetensors, the trained tensors only."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..engine.compose import ComposedLM
from ..engine.config import CALMConfig
from ..errors import CALMError

METHODS = ("calm", "lora", "finetune")
BASELINES = METHODS[1:]
CONFIG_NAME, WEIGHTS_NAME = "baseline_config.json", "baseline.safetensors"


def linear_modules(model, layers) -> dict[str, tuple[int, int]]:
    """{module name suffix: (in, out) of the first such module} for every linear layer inside the decoder layers:
    what LoRA may target. transformers' Conv1D (GPT-2) counts as linear, as peft treats it."""
    found = {}
    for layer in layers:
        for name, module in layer.named_modules():
            shape = _linear_shape(module)
            if shape and name:
                found.setdefault(name.rpartition(".")[2], shape)
    return found


def _linear_shape(module) -> tuple[int, int] | None:
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        return module.weight.shape[0], module.nf
    return None


def lora_rank(model, layers, budget: int) -> tuple[int, list[str]]:
    """(rank, target module suffixes): LoRA on every linear layer of every decoder layer costs rank * sum(in + out);
    the rank is the one whose count is nearest the budget (at least 1)."""
    targets = linear_modules(model, layers)
    if not targets:
        kinds = sorted({type(m).__name__ for layer in layers for m in layer.modules()})
        raise CALMError(f"LoRA needs linear layers inside the anchor's decoder layers, and {type(model).__name__} has "
                        f"none that peft knows (module types found: {', '.join(kinds)}). Try method 'finetune'.")
    per_rank = sum(i + o for layer in layers for _, m in layer.named_modules() if (s := _linear_shape(m))
                   for i, o in [s])
    return max(1, round(budget / per_rank)), sorted(targets)


def top_layer_parameters(layers, budget: int) -> list[str]:
    """Names (within the decoder layer list, e.g. "11.mlp.down_proj.weight") of the tensors fine-tuned: from the
    top layer down, each tensor taken whole while it fits in what is left of the budget (at least one)."""
    chosen, left = [], budget
    for index in reversed(range(len(layers))):
        for name, p in layers[index].named_parameters():
            if p.numel() <= left or not chosen:
                chosen.append(f"{index}.{name}")
                left -= p.numel()
        if left <= 0:
            break
    return chosen


class TrainedPart(nn.Module):
    """What the Trainer optimises in place of a bridge: the baseline's trainable tensors (shared with the model)."""

    def __init__(self, named: dict[str, nn.Parameter]):
        super().__init__()
        self.names = list(named)
        self.tensors = nn.ParameterList(named.values())
        self.augments: list = []  # no composition layers: the engine's bridge loops see none

    def blocks(self) -> list:
        return []

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.tensors)


class AnchorBaseline(ComposedLM):
    """The anchor with a LoRA or its top layers trained (see the module docstring)."""

    def __init__(self, anchor, method: str, budget: int, rank: int | None = None):
        if method not in BASELINES:
            raise CALMError(f"Unknown baseline method {method!r}; choose one of {', '.join(BASELINES)}.")
        if budget < 1:
            raise CALMError(f"A baseline needs a parameter budget of at least 1, got {budget}.")
        model, tokenizer = anchor
        self.original, self.method, self.budget = model, method, int(budget)
        tuned = copy.deepcopy(model)
        super().__init__((tuned, tokenizer), [], CALMConfig())
        self.anchor.model = self._attach(tuned, rank)
        self.bridge = TrainedPart(self._trainable)

    def _attach(self, tuned, rank):
        layers = self.anchor.layers
        if self.method == "finetune":
            self.targets, self.rank = top_layer_parameters(layers, self.budget), None
            params = dict(layers.named_parameters())
            self._trainable = {f"layers.{n}": params[n] for n in self.targets}
            for p in self._trainable.values():
                p.requires_grad_(True)
            return tuned
        from peft import LoraConfig, get_peft_model

        matched, targets = lora_rank(tuned, layers, self.budget)
        self.rank, self.targets = rank or matched, targets
        conv1d = any(type(m).__name__ == "Conv1D" for m in tuned.modules())
        # peft injects its layers in place: `tuned` itself now runs with the LoRA (the wrapper only names them)
        wrapped = get_peft_model(tuned, LoraConfig(r=self.rank, lora_alpha=self.rank, lora_dropout=0.0,
                                                   target_modules=targets, fan_in_fan_out=conv1d))
        self._trainable = {n: p for n, p in wrapped.named_parameters() if p.requires_grad}
        tuned.eval()
        return tuned

    def _anchor_model(self):
        # gate scale 0 (this thread's) is the anchor as it was: the shared, untouched model; nothing is swapped,
        # so a chat with the baseline in another thread is never affected
        return self.original if self._gate_scale == 0.0 else self.anchor.model

    def num_parameters(self) -> tuple[int, int]:
        return self.bridge.num_parameters(), self.anchor.info.num_parameters

    def describe(self) -> dict:
        return {"method": self.method, "budget": self.budget, "trainable": self.bridge.num_parameters(),
                "rank": self.rank, "targets": self.targets, "anchor": self.anchor.info.name}

    def save_trained(self, directory, extra: dict | None = None) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({n: p.detach().contiguous().cpu() for n, p in zip(self.bridge.names, self.bridge.tensors)},
                  str(directory / WEIGHTS_NAME))
        (directory / CONFIG_NAME).write_text(json.dumps({**self.describe(), **(extra or {})}, indent=2))
        return directory

    save_pretrained = save_trained

    @classmethod
    def from_pretrained(cls, directory, anchor) -> "AnchorBaseline":
        """A saved baseline onto the (model, tokenizer) it was trained from."""
        directory = Path(directory)
        try:
            meta = json.loads((directory / CONFIG_NAME).read_text())
        except (OSError, ValueError) as exc:
            raise CALMError(f"{directory} holds no baseline ({CONFIG_NAME}): {exc}") from None
        baseline = cls(anchor, meta["method"], meta["budget"], meta.get("rank"))
        tensors = load_file(str(directory / WEIGHTS_NAME))
        if set(tensors) != set(baseline.bridge.names):
            raise CALMError(f"The baseline in {directory} does not fit this anchor: its tensors differ.")
        with torch.no_grad():
            for name, p in zip(baseline.bridge.names, baseline.bridge.tensors):
                if p.shape != tensors[name].shape:
                    raise CALMError(f"The baseline in {directory} does not fit this anchor ({name}: "
                                    f"{tuple(tensors[name].shape)} vs {tuple(p.shape)}).")
                p.copy_(tensors[name])
        return baseline
