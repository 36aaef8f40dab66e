"""Scores per model (calm_core.evaluation) and the table beside the paper's FLORES-200 numbers.

Rows are what we measure, columns the models, as in the key-value demo; the paper's Table 2 has
languages for columns instead, so its figures go into paper_table row by row: its average over
the 10 languages it lists beside our held-out chrF, and three languages alone."""
from __future__ import annotations

import json
import time
from pathlib import Path

from demos.kv_arithmetic.base import log

COLUMNS = ["m_A", "m_B", "CALM", "m_B fine-tuned (parallel set)", "CALM with random m_A"]
CHRF_HELDOUT = "chrF, held-out sentences"
WORD_ROWS = ["grammatical English %", "subject noun right %", "verb right %", "object noun right %"]
ROWS = [CHRF_HELDOUT, "BLEU, held-out sentences", "exact match %, held-out sentences", *WORD_ROWS,
        "chrF, parallel-set sentences", "English loss (nats/char)"]
# Table 2 of the paper (FLORES-200, XX -> En, chrF1): PaLM2-XXS+NTL (m_A), PaLM2-S (m_B), CALM.
PAPER_TABLE = {
    CHRF_HELDOUT: {"m_A": 37.2, "m_B": 41.7, "CALM": 46.1},  # the paper's average over 10 languages
    "FLORES-200 lij -> en chrF (paper only)": {"m_A": 32.0, "m_B": 32.6, "CALM": 44.1},
    "FLORES-200 taq -> en chrF (paper only)": {"m_A": 46.9, "m_B": 44.6, "CALM": 55.1},
    "FLORES-200 ban -> en chrF (paper only)": {"m_A": 4.1, "m_B": 5.4, "CALM": 11.8},
}


def word_scores(lang, predicted: list[str], sentences: list) -> dict:
    """Which words of each held-out translation were right (% of sentences): the English is read
    back with the grammar, leniently (wrong agreement or a / an still parse); a text that does
    not parse gets no word right. "grammatical" is the strict parse."""
    from .language import parse_english

    n = max(1, len(sentences))
    loose = [parse_english(lang, p, strict=False) for p in predicted]
    right = lambda f: 100.0 * sum(x is not None and f(x) == f(ref) for x, ref in zip(loose, sentences)) / n
    return {"grammatical English %": 100.0 * sum(parse_english(lang, p) is not None for p in predicted) / n,
            "subject noun right %": right(lambda x: x.subject.noun), "verb right %": right(lambda x: x.verb),
            "object noun right %": right(lambda x: x.object.noun)}


def evaluate_all(columns: dict, files: dict, lang, heldout: list, max_new_tokens: int) -> tuple[dict, dict, dict]:
    """columns: name -> (model or ComposedLM, tokenizer or None). Greedy translations of the
    held-out and parallel-set prompts, scored with calm_core.evaluation.text_scores (sacrebleu's
    chrF and BLEU, exact match) and word by word, and each model's loss on held-out English.
    Returns (table row -> column -> value, predictions on held-out prompts, sacrebleu signatures)."""
    from calm_core.data import Example
    from calm_core.evaluation import as_composed, lm_loss, predictions, text_scores

    table = {row: {} for row in ROWS}
    preds, signatures = {}, {}
    for col, (target, tok) in columns.items():
        t = time.perf_counter()
        calm = as_composed(target, tok)
        for key, name in (("heldout", "eval_heldout"), ("seen", "eval_seen")):
            rows = files[name]
            predicted = predictions(calm, [Example(p, c) for p, c in rows], max_new_tokens)
            scores, signatures = text_scores(predicted, [c for _, c in rows])
            if key == "heldout":
                preds[col] = predicted
                table[CHRF_HELDOUT][col] = scores["chrf"]
                table["BLEU, held-out sentences"][col] = scores["bleu"]
                table["exact match %, held-out sentences"][col] = scores["exact_match"]
                for row, value in word_scores(lang, predicted, heldout).items():
                    table[row][col] = value
            else:
                table["chrF, parallel-set sentences"][col] = scores["chrf"]
        english = [Example("", lang.english(x)) for x in heldout]
        table["English loss (nats/char)"][col] = lm_loss(calm, english)["loss"]
        log(f"evaluated {col} in {time.perf_counter() - t:.0f}s: " + ", ".join(
            f"{r} {table[r][col]:.2f}" for r in ROWS))
    rounded = {row: {c: round(v, 3 if "loss" in row else 1) for c, v in cols.items()} for row, cols in table.items()}
    return rounded, preds, signatures


def fmt(v) -> str:
    return "–" if v is None else f"{v:.1f}" if abs(v) >= 10 or v == 0 else f"{v:.2f}"


def markdown(table: dict, paper: dict = PAPER_TABLE) -> str:
    head = "| | " + " | ".join(COLUMNS) + " | paper m_A | paper m_B | paper CALM |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 4)]
    for row in list(table) + [r for r in paper if r not in table]:
        ours, ref = table.get(row, {}), paper.get(row, {})
        cells = [fmt(ours.get(c)) for c in COLUMNS] + [fmt(ref.get(c)) for c in ("m_A", "m_B", "CALM")]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_figure(table: dict, paper: dict = PAPER_TABLE):
    """Grouped bars of the chrF rows: our models and controls, and the paper's FLORES average."""
    import plotly.graph_objects as go

    rows = [r for r in table if r.startswith("chrF")]
    colors = {"m_A": "#8da0cb", "m_B": "#66c2a5", "CALM": "#fc8d62",
              "m_B fine-tuned (parallel set)": "#a6d854", "CALM with random m_A": "#b3b3b3"}
    fig = go.Figure()
    for col in COLUMNS:
        ys = [table[r].get(col) for r in rows]
        fig.add_bar(name=col, x=rows, y=ys, marker_color=colors[col], text=[fmt(y) for y in ys], textposition="outside")
    for col in ("m_A", "m_B", "CALM"):
        ys = [paper.get(r, {}).get(col) for r in rows]
        fig.add_bar(name=f"paper {col} (FLORES avg.)", x=rows, y=ys, marker_color="rgba(0,0,0,0)",
                    marker_line_color=colors[col], marker_line_width=2, marker_pattern_shape="/",
                    text=[fmt(y) if y is not None else "" for y in ys], textposition="outside")
    fig.update_layout(barmode="group", title="Made-up language -> English: chrF", yaxis={"title": "chrF", "range": [0, 110]},
                      legend={"orientation": "h", "y": -0.2}, template="plotly_white", height=480)
    return fig


def save(table: dict, out_dir, meta: dict | None = None) -> None:
    """table.json (with predictions and settings), table.md and table.html in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps({"table": table, "paper_table": PAPER_TABLE, **(meta or {})}, indent=2))
    (out / "table.md").write_text(markdown(table) + "\n")
    table_figure(table).write_html(out / "table.html", include_plotlyjs="cdn")
