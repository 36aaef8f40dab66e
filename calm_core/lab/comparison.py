"""The paper's comparison in a lab session: baselines (the session's anchor, copied and trained with as many
trainable parameters as its bridge: training/baselines.py), their rows beside the composition's on the same examples,
and the forgetting set (training/forgetting.py) for the anchor alone, the composition and each baseline."""
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


FORGETTING = "forgetting"  # a metric name the Evaluate tab offers beside evaluation.METRICS
FORGETTING_COLUMNS = ("forgetting: perplexity ratio", "forgetting: expected words")


def evaluate_all(calm: ComposedLM, examples, metrics, max_new_tokens, progress, baselines: dict):
    """evaluation.evaluate with a row per baseline; with FORGETTING among the metrics, each row but the augmenting
    models' also gets the forgetting set's perplexity ratio (to the anchor alone) and expected-word count."""
    from ..training.evaluation import evaluate
    from ..training.forgetting import forgetting_rows

    table = evaluate(calm, examples, [m for m in metrics if m != FORGETTING], max_new_tokens, progress,
                     columns(baselines, calm))
    if FORGETTING in metrics:
        anchor = ComposedLM((calm.anchor.model, calm.anchor.tokenizer), [])
        contenders = [(table.rows[0]["model"], anchor), ("CALM", calm)] + columns(baselines, calm)
        found = {r["model"]: r for r in forgetting_rows(contenders, calm.anchor.tokenizer)}
        for row in table.rows:
            if row["model"] in found:
                row[FORGETTING_COLUMNS[0]] = found[row["model"]]["perplexity_ratio"]
                row[FORGETTING_COLUMNS[1]] = found[row["model"]]["expected_words"]
    return table
