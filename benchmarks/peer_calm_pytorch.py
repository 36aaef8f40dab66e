"""The comparison peer: the PyPI package calm-pytorch (0.2.2), all of its code kept here.

It is installed only for benchmarking (benchmarks/requirements.txt); without it the suite skips
its rows and says so. calm-pytorch composes x-transformers models, so the anchor and augment are
rebuilt as x-transformers decoders of the same shapes as ours (layers, width, heads, head size,
MLP 4x, vocab, learned absolute positions, tied embeddings), fed the same token ids. Its
cross-attention is given our head count and head size and our composition layer pairs, so the
comparison is of implementations, not of choices; differences() lists what still differs.
"""
from __future__ import annotations

import contextlib
import io
from importlib import metadata

import torch

from . import models
from .models import Shapes

PACKAGE = "calm-pytorch"


def unavailable() -> str | None:
    """Why the peer cannot run here, or None when it can."""
    try:
        import CALM_pytorch  # noqa: F401
    except ImportError as error:
        return f"{PACKAGE} is not installed ({error}); pip install -r benchmarks/requirements.txt"
    return None


def versions() -> dict:
    return {name: metadata.version(name) for name in (PACKAGE, "x-transformers")}


def decoder(vocab: int, layers: int, width: int, heads: int, max_positions: int, seed: int):
    """An x-transformers decoder shaped like tiny_model("gpt2", ...)."""
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(seed)
    return TransformerWrapper(
        num_tokens=vocab, max_seq_len=max_positions, tie_embedding=True,
        attn_layers=Decoder(dim=width, depth=layers, heads=heads, attn_dim_head=width // heads, ff_mult=4,
                            attn_flash=True),
    )


def decoders(shapes: Shapes):
    """Fresh x-transformers copies of our anchor and augment (same seeds as ours, different weights)."""
    (a_layers, a_width, a_heads), (b_layers, b_width, b_heads) = shapes.anchor, shapes.augment
    return (decoder(shapes.vocab, a_layers, a_width, a_heads, shapes.max_positions, seed=0),
            decoder(shapes.vocab, b_layers, b_width, b_heads, shapes.max_positions, seed=1))


def build(shapes: Shapes, layer_pairs: list[tuple[int, int]]):
    """calm-pytorch's CALM over x-transformers copies of our two models.

    layer_pairs: ours, 0-based (anchor layer, augment layer); calm-pytorch wants 1-based
    (augment layer, anchor layer). Its cross-attention gets our head count and head size."""
    from CALM_pytorch import CALM, AugmentParams

    anchor, augment = decoders(shapes)
    connections = tuple((aug + 1, anc + 1) for anc, aug in layer_pairs)
    _, width, heads = shapes.anchor
    attn = dict(linear_project_context=True, pre_rmsnorm=True, flash=True, heads=heads, dim_head=width // heads)
    return CALM(anchor, AugmentParams(model=augment, connections=connections), attn_kwargs=attn)


def default_connections(shapes: Shapes) -> tuple[tuple[int, int], ...]:
    """The (augment, anchor) layer pairs, 1-based, that calm-pytorch chooses itself for shapes.every."""
    from CALM_pytorch import CALM, AugmentParams

    anchor, augment = decoders(shapes)
    return CALM(anchor, AugmentParams(model=augment, connect_every_num_layers=shapes.every)).connections[0]


def parameters(calm) -> dict:
    """Trainable (its cross-attentions, all that CALM.parameters() returns) and total."""
    trainable = sum(p.numel() for p in calm.parameters())
    anchor, augment = calm.anchor_llm, calm.augment_llms[0].model
    count = lambda module: sum(p.numel() for p in module.parameters())
    return {"trainable": trainable, "total": trainable + count(anchor) + count(augment),
            "anchor": count(anchor), "augment": count(augment)}


def train_runner(calm, ids: torch.Tensor, steps: int, callback):
    """calm-pytorch's training step, as its FineTuner does it, `steps` times: CALM.forward returns the
    loss (the augment reads the prompt, the anchor the sequence), backward, clip, AdamW on the
    cross-attentions. ids: (batch, length + 1), since CALM.forward drops the last token as labels."""
    optimizer = torch.optim.AdamW(calm.parameters(), lr=1e-4)

    def run():
        for _ in range(steps):
            loss = calm(ids, prompt=ids[:, :-1])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(calm.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            callback()
    return run


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """calm-pytorch always samples with Gumbel noise; leaving only the argmax finite makes it greedy."""
    return logits.masked_fill(logits < logits.amax(-1, keepdim=True), float("-inf"))


def generate(calm, prompt_ids: torch.Tensor, new_tokens: int) -> None:
    """Its generate() for exactly new_tokens tokens (no EOS stop); its progress bar is silenced."""
    with contextlib.redirect_stderr(io.StringIO()):
        calm.generate(prompt_ids, seq_len=prompt_ids.shape[1] + new_tokens, filter_fn=greedy, filter_kwargs={})


def differences(shapes: Shapes, batch: int, length: int) -> list[str]:
    """What still differs between its setup and ours, in the words of the report."""
    (a_layers, a_width, a_heads), ours = shapes.anchor, models.layer_pairs(shapes)
    given = ", ".join(f"augment {aug + 1} -> anchor {anc + 1}" for anc, aug in ours)
    default = "" if unavailable() else (
        f"; its own rule for connect_every_num_layers={shapes.every} would pair "
        + ", ".join(f"augment {aug} -> anchor {anc}" for aug, anc in default_connections(shapes)))
    leak = a_layers * batch * length * a_width * 4 / 2**20
    return [
        "Models: x-transformers decoders (pre-LayerNorm, GELU MLP 4x, no q/k/v biases) instead of Hugging Face "
        "GPT-2, with the same layers, width, heads, head size, vocab and positions; parameter counts are listed.",
        f"Layers (1-based): it is given ours ({given}), so that its backward pass is as long as ours{default}.",
        "Bridge: x-transformers cross-attention with a linear projection of the augment states, RMSNorm on the anchor "
        "side, zero-initialised output and per-head value gates; ours has LayerNorm on both sides and a per-channel "
        f"tanh gate. Both use {a_heads} heads of {a_width // a_heads}.",
        "Masking: its anchor tokens attend to every augment position (no causal alignment), so in training they see "
        "future tokens; ours lets each anchor token see only the augment tokens it has read.",
        "Generation: it runs the augment once, on the prompt, never on generated tokens, and keeps no KV cache: each "
        "new token re-runs the whole anchor over the whole sequence. Ours runs both models on every new token, with "
        "KV caches. Greedy is imposed through its filter_fn (only the argmax survives its Gumbel sampling).",
        "Memory: at construction it hooks a recorder onto every anchor block that keeps each block's output of every "
        "later forward (only a call through its wrapper clears them, and CALM.forward calls the anchor directly): "
        f"at least {leak:.3g} MiB a step at batch {batch} x {length} (layers x batch x length x width x 4 bytes).",
        "Its generate() returns the prompt together with the new tokens (an operator-precedence slip in its mask); "
        "only its time is used here.",
    ]
