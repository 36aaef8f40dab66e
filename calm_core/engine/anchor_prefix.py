"""The anchor's frozen prefix: its layers below the first one the bridge writes into.

Their states depend on the text alone (the anchor's weights are frozen and the bridge comes later),
so a trainer that sees each example many times can compute them once (prefix_states) and, at every
step, run the anchor with those layers replayed (replaying): for one forward call they are swapped
for modules that hand back the stored states. The model's own embeddings, masks and rotary code
still run (cheap); the layers above, the bridge and the loss run as ever.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
from torch import nn

from ..models.loading import model_lock


def prefix_depth(calm) -> int:
    """How many anchor layers lie wholly below the bridge (0: nothing to replay)."""
    pairs = [anchor for bridge in calm.bridge.augments for anchor, _ in bridge.pairs]
    if not pairs:
        return 0
    first = min(pairs)
    return first + 1 if calm.config.insert == "after" else first


class _Stop(Exception):
    pass


# Whether a model's decoder layers return a tuple (hidden, ...) rather than the hidden states, as seen
# by prefix_states: replayed layers must answer in the same form.
_TUPLE_OUTPUT: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()


@torch.no_grad()
def prefix_states(calm, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache=None) -> torch.Tensor:
    """(B, T, D_B): the output of the anchor's last prefix layer; the layers above do not run. cache: keys and
    values of earlier tokens (the rows' shared opening), extended by these; attention_mask then covers both."""
    depth, captured, model = prefix_depth(calm), {}, calm.anchor.model

    def capture(module, args, output):
        _TUPLE_OUTPUT[model] = isinstance(output, tuple)
        captured["states"] = output[0] if isinstance(output, tuple) else output
        raise _Stop

    assert depth > 0, "no frozen prefix to compute"
    with model_lock(model):  # the layer is looked up under the lock: another thread may be replaying
        handle = calm.anchor.layers[depth - 1].register_forward_hook(capture, prepend=True)
        try:
            model(input_ids=input_ids.to(model.device), attention_mask=attention_mask.long().to(model.device),
                  cache=cache, use_cache=cache is not None)
        except _Stop:
            pass
        finally:
            handle.remove()
    return captured["states"].detach()


class _Replay(nn.Module):
    """Stands in for a decoder layer: hands back `states`, or its input where states is None."""

    def __init__(self, original: nn.Module, states: torch.Tensor | None, as_tuple: bool):
        super().__init__()
        self._original = [original]  # a list: not registered as a submodule
        self.states, self.as_tuple = states, as_tuple

    def forward(self, *args, **kwargs):
        hidden = self.states if self.states is not None else (args[0] if args else kwargs["hidden_states"])
        return (hidden,) if self.as_tuple else hidden

    def __getattr__(self, name):  # attributes the model's loop reads (attention_type, layer_idx, ...)
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._original[0], name)


@contextmanager
def replaying(calm, states: torch.Tensor):
    """Inside the `with`, the anchor's prefix layers hand back `states` (B, T, D_B) instead of running."""
    layers, depth = calm.anchor.layers, prefix_depth(calm)
    with model_lock(calm.anchor.model):  # shared models: one thread's layers are swapped at a time
        originals = [layers[i] for i in range(depth)]
        try:
            for i, layer in enumerate(originals):
                layers[i] = _Replay(layer, states if i == depth - 1 else None, _TUPLE_OUTPUT.get(calm.anchor.model, False))
            yield
        finally:
            for i, layer in enumerate(originals):
                layers[i] = layer
