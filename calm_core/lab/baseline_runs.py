"""A baseline run in a lab session: the anchor of the session's composition, copied and trained with as many
trainable parameters as its bridge (training/baselines.py), with the memory the copy takes counted up front."""
from __future__ import annotations

from ..engine.compose import ComposedLM
from ..errors import CALMError
from ..training.baselines import BASELINES, AnchorBaseline


def model_for(calm: ComposedLM, method: str) -> ComposedLM:
    """What a run of `method` trains: the composition itself ("calm"), or a new baseline on its anchor."""
    if method == "calm":
        return calm
    budget = calm.num_parameters()[0]
    return AnchorBaseline((calm.anchor.model, calm.anchor.tokenizer), method, budget)


def copy_bytes(calm: ComposedLM, method: str) -> int:
    """The anchor's copy a baseline trains (the shared base model is never changed)."""
    if method == "calm":
        return 0
    return sum(p.numel() * p.element_size() for p in calm.anchor.model.parameters())


def trained_baseline(baselines: dict, name: str) -> AnchorBaseline:
    if name not in BASELINES:
        raise CALMError(f"Unknown baseline {name!r}; the baselines are {', '.join(BASELINES)}.")
    if name not in baselines:
        raise CALMError(f"No {name} baseline trained in this session yet: train with method {name!r} first.")
    return baselines[name]


def columns(baselines: dict, calm: ComposedLM) -> list[tuple[str, AnchorBaseline]]:
    """The Evaluate table's and the Chat tab's name for each baseline: what it is and its trainable parameters
    beside the bridge's, so that the comparison says it is like for like."""
    bridge = calm.num_parameters()[0]
    names = {"lora": "anchor + LoRA", "finetune": "anchor, top layers fine-tuned"}
    return [(f"{names[m]} ({b.num_parameters()[0]:,} trained; bridge {bridge:,})", b) for m, b in baselines.items()]
