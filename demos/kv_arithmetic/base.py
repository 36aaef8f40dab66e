"""Training the base models from scratch (not bridge training): plain PyTorch + transformers.

Every training example is a list of (text, is_target) segments; the character tokenizer gives
one token per character, so the loss mask follows the segments exactly, and an end-of-sequence
token closes every example as a target. AdamW with linear warmup and cosine decay.

A segment may carry a third element, an integer value: then `ValueHeads` (linear digit
classifiers on chosen decoder layers, used only while training and thrown away after) learn
to read that value's digits from the hidden state at the segment's last character. This is how
m_A is made to hold a key's whole value at the position right after the key, in one
key-independent code, instead of looking it up one digit at a time when it writes it.

A fourth element MERGED turns reading into writing: the segment (a word that stands for a number)
gets that number's own input embedding added to its last token's, and no number token follows.
This is exactly what a bridge into the anchor's embeddings hands over where a key ends, so the
anchor learns arithmetic over words that carry their values. Operand noise (Gaussian, relative
to each operand embedding's size) teaches it to read a number from an approximate vector: a
bridge is a linear map fitted on a few keys, never exact.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import random
import time
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from torch.nn.utils import parametrize
from transformers import AutoModelForCausalLM

from calm_core.models.tiny import SPECIAL_TOKENS, as_fast_tokenizer, tiny_config

from .data import ALPHABET

Segments = list[tuple]  # (text, is_target[, value at the text's last character[, MERGED]])
MERGED = "merged"
PLACES = 3  # digits of a value the value heads read: hundreds, tens, units


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def save_model(model, tokenizer, directory: Path) -> None:
    """A plain transformers model (parametrized embeddings baked in) and its tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    state = None
    if parametrize.is_parametrized(model.get_input_embeddings()):
        names = {module: name for name, module in model.named_modules()}
        state = {k: v for k, v in model.state_dict().items() if ".parametrizations." not in k}
        for module in (model.get_input_embeddings(), model.get_output_embeddings()):
            state[f"{names[module]}.weight"] = module.weight.detach()
    model.save_pretrained(directory, safe_serialization=True, state_dict=state)
    tokenizer.save_pretrained(directory)


def load_model(directory: Path):
    from calm_core.models.loading import load_tokenizer

    return AutoModelForCausalLM.from_pretrained(directory).eval(), load_tokenizer(str(directory))


def add_settings_arguments(parser: argparse.ArgumentParser, settings_cls) -> None:
    """One --flag per field of a settings dataclass; None means "not given". A list flag given with no
    values is the empty list (`--augment-value-layers`: no value heads)."""
    defaults = settings_cls()
    for f in dataclasses.fields(settings_cls):
        flag, value = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        elif isinstance(value, list):
            parser.add_argument(flag, type=int, nargs="*", default=None)
        else:
            parser.add_argument(flag, type=type(value), default=None)


def apply_arguments(settings, args: argparse.Namespace):
    """The settings with every field given on the command line replaced."""
    for f in dataclasses.fields(settings):
        if getattr(args, f.name, None) is not None:
            setattr(settings, f.name, getattr(args, f.name))
    return settings


def make_tokenizer(max_number: int = 200):
    """The shared tokenizer: one token per character, except that an operand (a number 0..max_number
    followed by an operator or "=") is one token. "qw95+22=117" -> q w 95 + 22 = 1 1 7.

    So a number that is computed with sits at one position, as a key does at its last letter: the
    place where the bridge can hand the anchor a key's value. Answers stay digit by digit."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for ch in ALPHABET:
        vocab.setdefault(ch, len(vocab))
    for n in range(max_number + 1):
        vocab.setdefault(str(n), len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    numbers = "|".join(sorted(map(str, range(max_number + 1)), key=len, reverse=True))
    operand = rf"(?<!\d)(?:{numbers})(?=[+\-=])"  # a whole number of the vocabulary before an operator
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(operand + r"|\d|\D"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return as_fast_tokenizer(tokenizer, add_bos=True)


def build_model(tokenizer, layers: int = 4, width: int = 128, heads: int = 4, seed: int = 0, max_positions: int = 96,
                digit_embeddings: bool = True):
    """A Llama-style model from a config. digit_embeddings: the number tokens' input and output
    embeddings are sums of one learned vector per (place, digit) while training (see DigitEmbeddings)."""
    torch.manual_seed(seed)
    config = tiny_config("llama", len(tokenizer), layers=layers, width=width, heads=heads, max_positions=max_positions)
    config.intermediate_size = 4 * width
    model = AutoModelForCausalLM.from_config(config)
    if digit_embeddings:
        for module in (model.get_input_embeddings(), model.get_output_embeddings()):
            parametrize.register_parametrization(module, "weight", DigitEmbeddings(tokenizer, width))
    return model


class DigitEmbeddings(torch.nn.Module):
    """A parametrization of an embedding matrix: the row of number n is P_units[n % 10] +
    P_tens[n // 10 % 10] + P_hundreds[n // 100 % 10]; other rows are free.

    Every value is then a linear digit code in both models: m_A reads out a key's value along the
    same per-digit directions for every key, and the anchor computes from a per-digit code, so one
    linear map, fitted on the few values of the training keys, carries over to held-out keys.
    Saved models are plain (save_model bakes the rows in)."""

    def __init__(self, tokenizer, width: int):
        super().__init__()
        numbers = {int(t): i for t, i in tokenizer.get_vocab().items() if t.isdigit()}
        self.register_buffer("rows", torch.tensor(list(numbers.values())), persistent=False)
        self.register_buffer("digits", torch.tensor([digits_of(n)[::-1] for n in numbers]), persistent=False)
        self.places = torch.nn.Parameter(torch.randn(PLACES, 10, width) * 0.02)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        rows = sum(self.places[p][self.digits[:, p]] for p in range(PLACES))  # (numbers, width)
        return weight.index_copy(0, self.rows, rows.to(weight.dtype))


def digits_of(value: int) -> list[int]:
    return [value // 10 ** p % 10 for p in reversed(range(PLACES))]


def token_ids(tokenizer, text: str) -> list[int]:
    """The tokens of one segment, no special tokens (one per character with the character tokenizer)."""
    return tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


def encode_segments(tokenizer, examples: list[Segments]):
    """(input_ids, attention_mask, labels, value_digits, merged) right-padded; labels -100 off target;
    value_digits (B, T, PLACES): digits to read where a segment carries a value, -100 elsewhere;
    merged (B, T): the token id of a number whose embedding is added there (MERGED), -1 elsewhere."""
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    vocab = tokenizer.get_vocab()
    rows, targets, values = [], [], []
    for segs in examples:
        text = "".join(seg[0] for seg in segs)
        encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
        ends, end = [], 0  # a token belongs to the segment its last character is in
        for seg in segs:
            end += len(seg[0])
            ends.append(end)
        ids, tgt, at, which = [bos], [False], {}, 0
        for token, (_, stop) in zip(encoding.ids, encoding.offsets):
            while stop > ends[which]:
                which += 1
            ids.append(token)
            tgt.append(bool(segs[which][1]))
            if len(segs[which]) > 2:
                at[which] = len(ids) - 1  # the segment's last token so far
        at = {pos: (segs[w][2], MERGED in segs[w][3:]) for w, pos in at.items()}
        ids.append(eos)
        tgt.append(True)
        rows.append(ids)
        targets.append(tgt)
        values.append(at)
    T = max(map(len, rows))
    input_ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    labels = torch.full((len(rows), T), -100, dtype=torch.long)
    value_digits = torch.full((len(rows), T, PLACES), -100, dtype=torch.long)
    merged = torch.full((len(rows), T), -1, dtype=torch.long)
    for i, (ids, tgt, at) in enumerate(zip(rows, targets, values)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
        # unshifted: transformers' causal-LM loss shifts labels itself (logit t predicts token t+1)
        labels[i, : len(ids)] = torch.tensor([x if t else -100 for x, t in zip(ids, tgt)])
        for pos, (value, is_merged) in at.items():
            value_digits[i, pos] = torch.tensor(digits_of(value))
            if is_merged:
                merged[i, pos] = vocab[str(value)]
    return input_ids, mask, labels, value_digits, merged


def number_token_mask(tokenizer) -> torch.Tensor:
    """(vocab,) True for the whole-number tokens."""
    mask = torch.zeros(len(tokenizer), dtype=torch.bool)
    mask[[i for t, i in tokenizer.get_vocab().items() if t.isdigit()]] = True
    return mask


def input_embeddings(model, input_ids, labels, merged, numbers: torch.Tensor, noise: float = 0.0):
    """The input embeddings with MERGED numbers added, and with Gaussian noise of relative size
    `noise` on every number in the prompt (operands and merged words; never the answer, which the
    model reads back while writing it)."""
    table = model.get_input_embeddings()
    x = table(input_ids)
    is_merged = merged >= 0
    merged_rows = table(merged.clamp(min=0))
    x = x + merged_rows * is_merged[..., None]
    if noise:
        operand = (numbers[input_ids] | is_merged) & (labels == -100)
        number = torch.where(is_merged[..., None], merged_rows, x)
        size = number.norm(dim=-1, keepdim=True) / number.shape[-1] ** 0.5
        x = x + noise * size * torch.randn_like(x) * operand[..., None]
    return x


class ValueHeads(torch.nn.Module):
    """Linear digit classifiers on the outputs of some decoder layers (training only).

    Reading asks each chosen layer to hold every digit of a value linearly at the positions the
    segments mark, for all values at once, so that one map read off a few keys fits every key.
    With regression, each head is fitted to the digits' one-hot code by squared error instead of
    cross-entropy: the layer must then hold that code linearly and exactly, not just separably,
    which is what a linear bridge fitted on a few keys needs to carry a value to held-out keys."""

    def __init__(self, width: int, layers: list[int], regression: bool = False):
        super().__init__()
        self.layers, self.regression = list(layers), regression
        self.heads = torch.nn.ModuleList(torch.nn.Linear(width, 10 * PLACES) for _ in self.layers)

    def loss(self, model, inputs_embeds, attention_mask, labels, value_digits):
        """The LM loss plus the mean digit cross-entropy over the chosen layers."""
        from calm_core.models.loading import decoder_layers

        captured, blocks = {}, decoder_layers(model)

        def capture(index):
            def hook(module, args, output):
                captured[index] = output[0] if isinstance(output, tuple) else output
            return hook

        handles = []
        try:
            handles += [blocks[i].register_forward_hook(capture(i)) for i in self.layers]
            lm_loss = model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, labels=labels).loss
        finally:
            for handle in handles:
                handle.remove()
        where = value_digits[..., 0] >= 0
        if not where.any() or not self.layers:
            return lm_loss
        target = value_digits[where]  # (N, PLACES)
        value_loss = sum(self._digit_loss(head(captured[i][where]).view(-1, 10), target.view(-1))
                         for i, head in zip(self.layers, self.heads)) / len(self.layers)
        return lm_loss + value_loss

    def _digit_loss(self, logits, digits):
        if self.regression:
            return ((logits - torch.nn.functional.one_hot(digits, 10).to(logits.dtype)) ** 2).sum(-1).mean()
        return torch.nn.functional.cross_entropy(logits, digits)


def lr_at(step: int, total: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def train_lm(model, tokenizer, sampler: Callable[[random.Random], Segments], steps: int, batch_size: int = 128,
             lr: float = 2e-3, warmup: int = 100, weight_decay: float = 0.1, seed: int = 0,
             time_limit: float | None = None, log_every: int = 200, evaluate: Callable[[], dict] | None = None,
             eval_every: int = 0, log=print, value_layers: list[int] | None = None,
             value_heads: ValueHeads | None = None, value_regression: bool = False, operand_noise: float = 0.0,
             every_step: Callable[[int], None] | None = None) -> list[dict]:
    """Train all parameters of `model` on examples drawn from `sampler`. With time_limit (seconds)
    the cosine schedule is stretched over the steps that fit: the step count is re-estimated
    from the measured speed after 20 steps. value_layers: train `ValueHeads` on those layers
    alongside (for samplers whose segments carry values); value_heads: a ValueHeads to train instead
    of a new one (to keep it for diagnostics); operand_noise: see input_embeddings; every_step(step)
    is called before each step (e.g. to take more threads once another job is done)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model.train()
    for p in model.parameters():
        p.requires_grad_(True)
    heads = value_heads or (ValueHeads(model.config.hidden_size, value_layers, value_regression)
                            if value_layers else None)
    numbers = number_token_mask(tokenizer)
    params = list(model.parameters()) + (list(heads.parameters()) if heads else [])
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98))
    history, start, total, window = [], time.perf_counter(), steps, []
    for step in range(10**9):
        if step >= total:
            break
        if time_limit and step == 20:
            per_step = (time.perf_counter() - start) / 20
            total = max(21, min(steps, int(time_limit / per_step)))
        if every_step is not None:
            every_step(step)
        ids, mask, labels, value_digits, merged = encode_segments(tokenizer, [sampler(rng) for _ in range(batch_size)])
        embeds = input_embeddings(model, ids, labels, merged, numbers, operand_noise)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, lr, warmup)
        if heads is not None:
            loss = heads.loss(model, embeds, mask, labels, value_digits)
        else:
            loss = model(inputs_embeds=embeds, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        window.append(float(loss.detach()))
        if (step + 1) % log_every == 0 or step + 1 == total:
            rec = {"step": step + 1, "loss": sum(window) / len(window), "time": time.perf_counter() - start}
            if evaluate is not None and eval_every and ((step + 1) % eval_every == 0 or step + 1 == total):
                model.eval()
                rec.update(evaluate())
                model.train()
            history.append(rec)
            log(f"  step {rec['step']}/{total} " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                           for k, v in rec.items() if k != "step"))
            window = []
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return history
