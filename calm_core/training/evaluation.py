"""Evaluation as the paper's tables do it: the anchor alone, each augmenting model alone and the
composition, on the same examples. Exact match for short answers, chrF and BLEU (sacrebleu's
metric classes, with their signatures) for generated text, loss / perplexity on held-out text."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..errors import CALMError
from .batches import collate, predicting_mask, prepare, token_losses
from .data import Example

METRICS = ("exact_match", "chrf", "bleu", "loss")


@dataclass
class EvalTable:
    rows: list[dict]  # one per model: {"model": name, metric: value, ...}
    signatures: dict[str, str] = field(default_factory=dict)
    predictions: dict[str, list[str]] = field(default_factory=dict)

    def to_markdown(self) -> str:
        metrics = [m for m in METRICS + ("perplexity",) if any(m in r for r in self.rows)]
        lines = ["| model | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
        for row in self.rows:
            cells = [_fmt(row.get(m)) for m in metrics]
            lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def _fmt(value) -> str:
    return "" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def as_composed(target, tokenizer=None):
    """A ComposedLM for a bare (model, tokenizer): the same generation and loss code for all."""
    from ..engine.compose import ComposedLM

    if isinstance(target, ComposedLM):
        return target
    if tokenizer is None:
        raise CALMError("A bare model needs its tokenizer for evaluation.")
    return ComposedLM((target, tokenizer), [])


@torch.no_grad()
def predictions(calm, examples: list[Example], max_new_tokens: int = 32, progress=None, batch_size: int = 16) -> list[str]:
    """Greedy completions of each example's prompt, decoded in batches of similar length
    (each equal to decoding it alone; see batched_generation)."""
    prompts = [e.prompt for e in examples]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding per batch
    out = [""] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        texts = calm.generate([prompts[i] for i in chunk], max_new_tokens=max_new_tokens)
        for i, text in zip(chunk, texts):
            out[i] = text
        if progress is not None:
            progress(min(start + batch_size, len(order)), len(order))
    return out


def exact_match_score(predicted: list[str], references: list[str]) -> float:
    """Percentage of predictions equal to the reference after stripping surrounding whitespace."""
    if not references:
        return 0.0
    return 100.0 * sum(p.strip() == r.strip() for p, r in zip(predicted, references)) / len(references)


def exact_match(target, tokenizer=None, examples: list[Example] = (), max_new_tokens: int = 8) -> float:
    calm = as_composed(target, tokenizer)
    return exact_match_score(predictions(calm, list(examples), max_new_tokens), [e.completion for e in examples])


def text_scores(predicted: list[str], references: list[str]) -> tuple[dict, dict]:
    """(scores, signatures): exact match, chrF and BLEU through sacrebleu's metric classes."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    scores = {
        "exact_match": exact_match_score(predicted, references),
        "chrf": chrf.corpus_score(predicted, [references]).score,
        "bleu": bleu.corpus_score(predicted, [references]).score,
    }
    return scores, {"chrf": str(chrf.get_signature()), "bleu": str(bleu.get_signature())}


@torch.no_grad()
def lm_loss(calm, examples: list[Example], batch_size: int = 16) -> dict:
    """Mean loss per target token (the completion, or the whole text) and its perplexity."""
    rows, _ = prepare(calm, list(examples))
    total, count = 0.0, 0
    for start in range(0, len(rows), batch_size):
        batch, labels = collate(calm, rows[start:start + batch_size])
        positions = predicting_mask(labels)
        losses = token_losses(calm.forward(batch, positions=positions), labels, positions)
        total, count = total + float(losses.sum()), count + losses.numel()
    loss = total / max(1, count)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50))}


def evaluate(calm, examples: list[Example], metrics=METRICS, max_new_tokens: int = 32, progress=None,
             baselines=()) -> EvalTable:
    """One table: the anchor alone, each augmenting model alone, the composition, and each (name, baseline) given
    (training/baselines.py: the anchor trained on the same data with as many parameters), on the same rows."""
    from ..engine.compose import ComposedLM

    unknown = sorted(set(metrics) - set(METRICS))
    if unknown:
        raise CALMError(f"Unknown metrics {unknown}; choose from {list(METRICS)}.")
    if not examples:
        raise CALMError("No examples to evaluate.")
    references = [e.completion for e in examples]
    contenders = [("anchor: " + calm.anchor.info.name, ComposedLM((calm.anchor.model, calm.anchor.tokenizer), []))]
    contenders += [(f"augment {k}: {m.info.name}", ComposedLM((m.model, m.tokenizer), [])) for k, m in enumerate(calm.augments)]
    contenders.append(("CALM", calm))
    contenders += list(baselines)
    table = EvalTable([])
    generate = any(m in metrics for m in ("exact_match", "chrf", "bleu"))
    for n, (name, model) in enumerate(contenders):
        row = {"model": name}
        if generate:
            step = (lambda i, total, n=n: progress(n * len(examples) + i, len(contenders) * len(examples))) if progress else None
            predicted = predictions(model, examples, max_new_tokens, step)
            scores, signatures = text_scores(predicted, references)
            table.signatures = {k: v for k, v in signatures.items() if k in metrics}
            row.update({m: v for m, v in scores.items() if m in metrics})
            table.predictions[name] = predicted
        if "loss" in metrics:
            row.update(lm_loss(model, examples))
        table.rows.append(row)
    return table


# How an answer is compared with its reference, by name (a preset says which suits each of its sets):
# "substitution" and "result" score one part of an answer that restates its operands ("95+22=117").
SCORERS = {
    "exact": lambda text: text.strip(),
    "substitution": lambda text: text.strip().split("=", 1)[0],  # "95+22=117" -> "95+22"
    "result": lambda text: text.strip().rsplit("=", 1)[-1],  # "95+22=117" -> "117"
}


def rescore(table: EvalTable, references: list[str], scoring: str = "exact") -> EvalTable:
    """Exact match recomputed on the part of each answer that `scoring` names (SCORERS)."""
    if scoring not in SCORERS:
        raise CALMError(f"Unknown scoring {scoring!r}; choose from {list(SCORERS)}.")
    if scoring == "exact":
        return table
    part = SCORERS[scoring]
    for row in table.rows:
        predicted = table.predictions.get(row["model"])
        if "exact_match" in row and predicted is not None:
            row["exact_match"] = exact_match_score([part(p) for p in predicted], [part(r) for r in references])
    return table
