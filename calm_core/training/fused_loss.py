"""Cross-entropy through the anchor's output layer, a few rows at a time, never holding all the logits.

A training step's loss needs the output layer only at the target tokens, but over the whole vocabulary: with
Gemma 3 as the anchor (262,144 words) a batch of 8 x 128 targets makes 1 GB of float32 logits, and their
log-softmax, its backward and the zeroed gradient make three more. Most of that is memory traffic, not
arithmetic, and it cost a composed step more than the frozen models' own forward and backward.
Here the logits are made `CHUNK` rows at a time, the loss taken, and the gradient with respect to the hidden
states computed at once ((softmax - one_hot) @ W, the output layer being frozen), so backward only scales it.
Same arithmetic as logits -> cross_entropy, a fraction of the memory.
"""
from __future__ import annotations

import torch

from ..models.devices import fast_bf16
from .batches import flat_predictions, token_losses

CHUNK = 128  # target rows whose logits exist at once: 128 x 262,144 floats = 134 MB


def plain_output_layer(model) -> torch.nn.Module | None:
    """The model's output layer when logits are exactly hidden @ W.T (+ b): a frozen plain Linear, no softcapping."""
    layer = model.get_output_embeddings()
    config = getattr(model.config, "text_config", None) or model.config
    if not isinstance(layer, torch.nn.Linear) or layer.weight.requires_grad or \
            getattr(config, "final_logit_softcapping", None):
        return None  # a trained output layer (a baseline) or capped logits: the plain logits path
    return layer


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets):
        # hidden (N, D) at the target tokens, weight (V, D) and bias (V,) frozen, targets (N,) -> losses (N,)
        want_grad = ctx.needs_input_grad[0]
        losses = torch.empty(len(hidden), dtype=torch.float32, device=hidden.device)
        grad = torch.empty_like(hidden) if want_grad else None
        for start in range(0, len(hidden), CHUNK):
            h, t = hidden[start:start + CHUNK], targets[start:start + CHUNK]
            logits = torch.nn.functional.linear(h, weight, bias).float()  # (c, V)
            top = logits.logsumexp(-1)
            losses[start:start + len(h)] = top - logits.gather(1, t[:, None]).squeeze(1)
            if want_grad:
                probs = logits.sub_(top[:, None]).exp_()  # softmax, in place
                probs[torch.arange(len(t), device=t.device), t] -= 1
                grad[start:start + len(h)] = (probs.to(weight.dtype) @ weight).to(grad.dtype)  # (c, D)
        if want_grad:
            ctx.save_for_backward(grad)
        return losses

    @staticmethod
    def backward(ctx, grad_losses):
        (grad,) = ctx.saved_tensors
        return grad * grad_losses[:, None].to(grad.dtype), None, None, None


def linear_cross_entropy(hidden: torch.Tensor, layer: torch.nn.Module, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy (N,) of layer(hidden) against targets, chunked (see the module's docstring).
    Under autocast the products run in its dtype, as the layer's own call would; except bf16 on a CPU without
    native bf16 (models.devices.fast_bf16), where they run in float32: there each bf16 product is converted around,
    and a Gemma-sized vocabulary made one bf16 step's loss 40 s instead of ~1 s (AVX2, 2 threads)."""
    assert not layer.weight.requires_grad, "the output layer is frozen; its gradient is not computed here"
    dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) else None
    if dtype == torch.bfloat16 and hidden.device.type == "cpu" and not fast_bf16("cpu"):
        dtype = torch.float32 if layer.weight.dtype == torch.float32 else dtype
    weight, bias = layer.weight, layer.bias
    if dtype is not None:
        weight, bias = weight.to(dtype), None if bias is None else bias.to(dtype)
        hidden = hidden.to(dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, bias, targets.to(hidden.device))


def cross_entropy_losses(out: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor,
                         output: torch.nn.Module | None) -> torch.Tensor:
    """Per-token cross-entropy (N,) whichever the forward gave: logits (output None, batches.token_losses) or
    the final hidden states at a (B, T) mask with the output layer (linear_cross_entropy)."""
    if output is None:
        return token_losses(out, labels, positions)
    flat, targets, _ = flat_predictions(out, labels, positions)
    return linear_cross_entropy(flat, output, targets)
