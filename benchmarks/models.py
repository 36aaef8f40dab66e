"""The models, tokenizer and texts that every benchmarked system shares, built offline.

One place fixes the shapes (issue 6: anchor GPT-2 12 layers x 256 wide with 8 heads, augment GPT-2
8 x 192 with 6 heads, vocab 512, composition every 4th augmenting layer), so that our composition,
the frozen models alone and calm-pytorch's x-transformers copies (peer_calm_pytorch.py) all have
the same sizes and read the same token ids. TINY is a microscopic stand-in for smoke runs and the
unit test: it checks that the code runs, its numbers mean nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import count as counter
from itertools import islice

import torch

from calm_core import CALMConfig, ComposedLM
from calm_core.models.tiny import bpe_tokenizer, char_tokenizer, tiny_model

CORPUS = [f"the {w} number {i} jumps over {j} lazy dogs and {w}s" for i, j, w in
          zip(range(400), range(400, 0, -1), ["cat", "fox", "bird", "tree"] * 100)]


@dataclass(frozen=True)
class Shapes:
    """Sizes of the two frozen models; (layers, width, heads) each. MLPs are 4x wide (GPT-2)."""

    name: str
    vocab: int
    anchor: tuple[int, int, int]
    augment: tuple[int, int, int]
    every: int
    max_positions: int  # long enough for the longest scaling prompt plus the generated tokens


FULL = Shapes("full", 512, (12, 256, 8), (8, 192, 6), every=4, max_positions=2048 + 64)
TINY = Shapes("tiny", 512, (8, 32, 4), (8, 16, 2), every=4, max_positions=2048 + 64)
SHAPES = {s.name: s for s in (FULL, TINY)}


@lru_cache(maxsize=None)
def tokenizer(vocab: int):
    """The byte-level BPE both models read (one shared tokenizer, as in the issue's pair)."""
    return bpe_tokenizer(CORPUS, vocab_size=vocab)


@dataclass
class Setup:
    """Our composition over fresh seeded models, with its tokenizer."""

    shapes: Shapes
    tokenizer: object
    calm: ComposedLM

    @property
    def anchor(self):
        return self.calm.anchor.model

    @property
    def augment(self):
        return self.calm.augments[0].model


def fused_gelu(model):
    """GPT-2's default "gelu_new" is the tanh-approximated GELU written as five Python-level tensor
    ops; "gelu_pytorch_tanh" is the same formula in one fused kernel (as x-transformers' nn.GELU).
    On CPU the unfused one costs a quarter of a training step of these frozen models."""
    from transformers.activations import ACT2FN

    model.config.activation_function = "gelu_pytorch_tanh"
    for block in model.transformer.h:
        block.mlp.act = ACT2FN["gelu_pytorch_tanh"]
    return model


def anchor_model(shapes: Shapes):
    return fused_gelu(tiny_model("gpt2", shapes.vocab, *shapes.anchor, seed=0, max_positions=shapes.max_positions))


def augment_model(shapes: Shapes):
    return fused_gelu(tiny_model("gpt2", shapes.vocab, *shapes.augment, seed=1, max_positions=shapes.max_positions))


def layer_pairs(shapes: Shapes) -> list[tuple[int, int]]:
    """Our (anchor layer, augment layer) pairs, 0-based: the ones every composing system uses."""
    return CALMConfig(every=shapes.every).layer_pairs(shapes.anchor[0], shapes.augment[0])


def build(shapes: Shapes) -> Setup:
    tok = tokenizer(shapes.vocab)
    calm = ComposedLM((anchor_model(shapes), tok), [(augment_model(shapes), tok)], CALMConfig(every=shapes.every))
    return Setup(shapes, tok, open_gates(calm))


def compose(setup: Setup, every: int) -> ComposedLM:
    """A new bridge over the same frozen models, composing every `every` augmenting layers."""
    calm = ComposedLM((setup.anchor, setup.tokenizer), [(setup.augment, setup.tokenizer)], CALMConfig(every=every))
    return open_gates(calm)


def compose_char_augment(setup: Setup) -> ComposedLM:
    """Our anchor with an augment of the same shape that reads characters: composition across two
    tokenizers, where generation re-tokenizes the text for the augment at every step."""
    chars = char_tokenizer()
    augment = fused_gelu(tiny_model("gpt2", max(setup.shapes.vocab, len(chars)), *setup.shapes.augment, seed=1,
                                    max_positions=setup.shapes.max_positions))
    calm = ComposedLM((setup.anchor, setup.tokenizer), [(augment, chars)], CALMConfig(every=setup.shapes.every))
    return open_gates(calm)


def open_gates(calm: ComposedLM) -> ComposedLM:
    """Gates start closed; open them so that timings include the bridge's full effect on outputs."""
    with torch.no_grad():
        for block in calm.bridge.blocks():
            block.gate.fill_(0.5)
    return calm


def texts(tok, count: int, tokens: int) -> list[str]:
    """`count` different texts of at least `tokens` tokens each."""
    return list(islice(_texts(tok, tokens), count))


def _texts(tok, tokens: int):
    """Corpus lines from shifted starts, doubled until the text has at least `tokens` tokens."""
    for i in counter():
        start, n = (i * 7) % len(CORPUS), 8
        while True:
            text = " ".join(CORPUS[(start + j) % len(CORPUS)] for j in range(n))
            if len(tok(text)["input_ids"]) >= tokens:
                break
            n *= 2
        yield text


def token_ids(tok, count: int, tokens: int) -> torch.Tensor:
    """(count, tokens) ids of real text, for systems that take ids rather than text."""
    return torch.tensor([tok(t)["input_ids"][:tokens] for t in texts(tok, count, tokens)])


def prompt(tok, tokens: int) -> tuple[str, torch.Tensor]:
    """A prompt text that tokenizes to exactly `tokens` ids, and those ids (1, tokens).

    A cut inside a word can re-tokenize differently, so cuts are tried from several texts until
    text -> ids -> text -> ids round-trips."""
    for text in islice(_texts(tok, tokens), 32):
        ids = tok(text)["input_ids"][:tokens]
        cut = tok.decode(ids)
        if tok(cut)["input_ids"] == ids:
            return cut, torch.tensor([ids])
    raise RuntimeError(f"No {tokens}-token prompt round-trips through the tokenizer.")
