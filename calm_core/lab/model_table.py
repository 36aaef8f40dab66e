"""What the Models tab lists about a composition: one row per model, short names, composition-layer labels."""
from __future__ import annotations

from pathlib import Path

from ..engine.compose import ComposedLM
from . import bounds


def model_rows(calm: ComposedLM) -> list[list]:
    """One row per model for the Models tab: role, name, architecture, layers, width, heads, parameters."""
    rows = []
    for role, member in [("anchor", calm.anchor)] + [(f"augment {k}", m) for k, m in enumerate(calm.augments)]:
        info = member.info
        rows.append([role, short_name(info.name), info.architecture, info.num_layers, info.width, info.num_heads,
                     f"{info.num_parameters:,}"])
    trainable, _ = calm.num_parameters()
    rows.append(["bridge", "trained", "gated cross-attention" if calm.config.gate != "none" else "cross-attention, no gate",
                 len(calm.bridge.blocks()), calm.anchor.info.width, bounds.heads(calm), f"{trainable:,}"])
    return rows


def short_name(name: str) -> str:
    """A model's name without the server's folders: presets/kv_arithmetic/anchor, or the hub id."""
    path = Path(name)
    if not path.is_absolute():
        return name
    parts = path.parts
    if "presets" in parts:
        return "/".join(parts[parts.index("presets"):])
    from ..models.real_pair import display_name

    title = display_name(path)  # "Gemma 3 270M (base)" for the real pair's folders
    return "/".join(parts[-2:]) if title == path.name else title


def layer_labels(calm: ComposedLM) -> list[str]:
    """One name per composition layer, written the same way as in every figure."""
    from .figures import layer_label

    return [layer_label(i, pair) for i, pair in enumerate(calm.layer_pairs())]
