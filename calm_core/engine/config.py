"""CALMConfig: which layers are composed and how the bridge is shaped (paper section 3.1)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..errors import CALMError

GATE_TYPES = ("channel", "scalar", "none")
INSERT_POINTS = ("after", "before")


@dataclass
class CALMConfig:
    """How to compose an anchor with each augmenting model.

    every:          use augmenting layers every, 2*every, ... (1-based; the paper uses 4) and as
                    many anchor layers spread evenly over the anchor's depth, the last included.
    anchor_layers:  explicit 0-based anchor layer indices (negative counts from the end).
    augment_layers: explicit 0-based augmenting layer indices; with only one of the two lists
                    given, the other side is spread evenly. The index one past the last layer (the
                    model's depth) is its final hidden state after its final norm: what its output layer
                    reads. Models such as Gemma carry huge constant activations in a few channels of
                    every inner layer, which swamp the rest under any norm; the final state has none.
    num_heads:      cross-attention heads; None uses the anchor's own head count.
    gate:           "channel" (one tanh gate per anchor channel, starts at 0), "scalar" (one per
                    layer, starts at 0) or "none" (the paper's plain residual add).
    norm:           LayerNorm on the anchor queries and on the augmenting states before they are
                    projected; keeps the bridge stable when residual streams have large norms.
    insert:         "after": each block reads and writes the output of its anchor layer (the
                    paper); "before": the input of it, so anchor layer 0 means the token
                    embeddings: the bridge then hands the anchor something in the form of a token.
    recency:        0, or a number of learned attention biases per head (starting at 0) for the newest
                    visible augmenting tokens, the last bucket shared by all older ones: cross-attention
                    then knows which augmenting state is the one aligned with the current token.
    null_slot:      a learned key per head with a zero value, visible from every position: attending to it
                    writes nothing, so a bridge can leave the positions where it has nothing to add alone
                    (softmax attention otherwise always writes some mix of augmenting states).
    relative:       scale each block's output by the RMS of the anchor state it is added to, so that the
                    bridge writes in units of the residual stream where it writes: the upper layers of
                    real models run 10-100x larger than the lower ones, and a bridge written in absolute
                    units needs thousands of steps to grow enough to change them.
    window:         0, or how many of the newest visible augmenting states each anchor token may attend to
                    (1: only the one aligned with it). A narrow window keeps a bridge trained on few
                    examples from keying on whole contexts (memorising them) instead of the aligned state.
    """

    every: int = 4
    anchor_layers: list[int] | None = None
    augment_layers: list[int] | None = None
    num_heads: int | None = None
    gate: str = "channel"
    norm: bool = True
    insert: str = "after"
    recency: int = 0
    null_slot: bool = False
    window: int = 0
    relative: bool = False

    def __post_init__(self):
        if not isinstance(self.recency, int) or self.recency < 0:
            raise CALMError(f"CALMConfig.recency must be a non-negative integer, got {self.recency!r}.")
        if not isinstance(self.window, int) or self.window < 0:
            raise CALMError(f"CALMConfig.window must be a non-negative integer, got {self.window!r}.")
        if not isinstance(self.relative, bool):
            raise CALMError(f"CALMConfig.relative must be True or False, got {self.relative!r}.")
        if not isinstance(self.null_slot, bool):
            raise CALMError(f"CALMConfig.null_slot must be True or False, got {self.null_slot!r}.")
        if self.insert not in INSERT_POINTS:
            raise CALMError(f"CALMConfig.insert must be one of {INSERT_POINTS}, got {self.insert!r}.")
        if self.gate not in GATE_TYPES:
            raise CALMError(f"CALMConfig.gate must be one of {GATE_TYPES}, got {self.gate!r}.")
        if not isinstance(self.every, int) or self.every < 1:
            raise CALMError(f"CALMConfig.every must be a positive integer, got {self.every!r}.")
        if self.num_heads is not None and self.num_heads < 1:
            raise CALMError(f"CALMConfig.num_heads must be positive, got {self.num_heads}.")
        for name in ("anchor_layers", "augment_layers"):
            value = getattr(self, name)
            if value is not None:
                if len(value) == 0:
                    raise CALMError(f"CALMConfig.{name} is empty; give at least one layer or None.")
                setattr(self, name, [int(i) for i in value])
        if self.anchor_layers is not None and self.augment_layers is not None:
            if len(self.anchor_layers) != len(self.augment_layers):
                raise CALMError(
                    f"CALMConfig.anchor_layers has {len(self.anchor_layers)} entries but "
                    f"augment_layers has {len(self.augment_layers)}; they are paired one to one."
                )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CALMConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CALMError(f"Unknown CALMConfig fields {unknown}; known fields are {sorted(known)}.")
        return cls(**data)

    def layer_pairs(self, anchor_depth: int, augment_depth: int) -> list[tuple[int, int]]:
        """(anchor layer, augmenting layer) pairs, 0-based, for models of these depths."""
        if self.augment_layers is not None:
            augment = _normalise(self.augment_layers, augment_depth, "augment_layers")
        elif self.anchor_layers is None:
            n = augment_depth // self.every
            if n == 0:
                raise CALMError(
                    f"CALMConfig(every={self.every}) selects no layer of a {augment_depth}-layer "
                    f"augmenting model; use every <= {augment_depth} or explicit layer lists."
                )
            augment = [self.every * (i + 1) - 1 for i in range(n)]
        else:
            augment = spread(augment_depth, len(self.anchor_layers))
        if self.anchor_layers is not None:
            anchor = _normalise(self.anchor_layers, anchor_depth, "anchor_layers")
        else:
            if len(augment) > anchor_depth:
                raise CALMError(
                    f"{len(augment)} composition layers do not fit a {anchor_depth}-layer anchor; "
                    f"raise CALMConfig.every or give explicit layer lists."
                )
            anchor = spread(anchor_depth, len(augment))
        return list(zip(anchor, augment))


def spread(depth: int, n: int) -> list[int]:
    """n layer indices spread evenly over depth layers, the last one included (0-based)."""
    if n > depth:
        raise CALMError(f"Cannot pick {n} distinct layers from a {depth}-layer model.")
    return [((i + 1) * depth) // n - 1 for i in range(n)]


def _normalise(layers: list[int], depth: int, name: str) -> list[int]:
    """0-based indices; an augmenting model also has index `depth`: its final hidden state, after its final norm."""
    out, top = [], depth + (name == "augment_layers")
    for i in layers:
        j = i + depth if i < 0 else i
        if not 0 <= j < top:
            raise CALMError(f"CALMConfig.{name} has layer {i}, outside a {depth}-layer model.")
        out.append(j)
    return out
