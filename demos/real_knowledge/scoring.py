"""How the table scores: exact match on the attribute (greedy, batched), and the anchor's general prompts with
the bridge on and off."""
from __future__ import annotations

import json
import re
from pathlib import Path

from calm_core.training.data import Example
from calm_core.training.evaluation import lm_loss, predictions

from .general import holds_expected
from .world import QUESTIONS

# the table's columns and rows
FT = "anchor + LoRA (composition data)"
COLUMNS = ["CALM", "anchor alone", "m_A alone (chat question)", "m_A alone (best prompt)", FT,
           "CALM with untrained m_A"]
ROW_TEST, ROW_DEV, ROW_SEEN = ("exact match %, held-out entities", "exact match %, dev entities",
                               "exact match %, composition entities")
ROW_PERPLEXITY, ROW_EXPECTED = ("general prompts: perplexity of written answers",
                                "general prompts: greedy answers holding an expected word")


# The trained answer starts with a space. SmolLM2 writes a word at the start of its turn without one, and then
# splits an invented name into single letters ("G" + "rou" + "mur": 27 distinct first tokens for 40 towns), while
# m_A learned the towns as " Grou" + "mur". With the space both tokenizers split the name alike, and m_A's own next
# token at the aligned position is the town's first token (60 of 60 development people, seed 0). Scoring strips it.
ANSWER_LEAD = " "


def trained_answer(value: str, entity: str | None = None, style: str = "town") -> str:
    """The completion the bridge is trained on for an attribute value (style "sentence": m_A's own phrasing)."""
    if style == "sentence":
        return f"{entity} was born in {value}."
    if style != "town":
        raise ValueError(f"answer_style is 'town' or 'sentence', not {style!r}")
    return ANSWER_LEAD + value


def names(text: str, value: str) -> bool:
    """The answer's first line names `value` as a whole word (how sentence answers are scored)."""
    first = text.strip().split("\n")[0]
    return re.search(rf"\b{re.escape(value)}\b", first) is not None


def answer(text: str) -> str:
    """The answer as scored: first line, spaces and a final full stop removed."""
    return text.strip().split("\n")[0].strip().rstrip(".").strip()


def starts_with_answer(calm, rows, s) -> tuple[float, list[str]]:
    """(% of greedy continuations that begin with the reference, the outputs): m_A alone completing its own
    phrasing. Its loss covered the town only, never what follows, so it runs on past the town
    (" Krurefeithodrerusai"): the town is there when the continuation begins with it."""
    preds = predictions(calm, examples(rows), max_new_tokens=s.max_new_tokens)
    right = [p.strip().startswith(r["completion"]) for p, r in zip(preds, rows)]
    return 100.0 * sum(right) / max(1, len(rows)), preds


def chat(tok, question: str) -> str:
    """The anchor's own chat format (SmolLM2's template with its default system line), ready for the answer."""
    return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)


def examples(rows) -> list[Example]:
    return [Example(r["prompt"], r["completion"], r.get("keep_anchor", False)) for r in rows]


def write_jsonl(path: Path, rows, keys=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({k: r[k] for k in (keys or r)}) + "\n" for r in rows))


def is_right(pred: str, row: dict, sentence: bool, extract=answer) -> bool:
    """One answer scored: the value named (a "value" column, or sentence answers) or exact match on it."""
    if "value" in row:  # a written file whose completion is the whole sentence
        return names(pred, row["value"])
    return names(pred, row["completion"]) if sentence else extract(pred) == row["completion"]


def exact(calm, rows, s, extract=answer) -> tuple[float, list[str]]:
    """(% right, the raw outputs) of greedy answers to rows' prompts: exact match on the value, or, for sentence
    answers (answer_style "sentence", or rows with a "value" column), the value named in the answer's first line."""
    preds = predictions(calm, examples(rows), max_new_tokens=s.max_new_tokens)
    sentence = getattr(s, "answer_style", "town") == "sentence"
    right = [is_right(p, r, sentence, extract) for p, r in zip(preds, rows)]
    return 100.0 * sum(right) / max(1, len(rows)), preds


def general_check(calm, rows, s) -> dict:
    """The anchor's other abilities: perplexity of written answers to general prompts, and greedy answers, with
    the bridge on and off (gate scale 0 is exactly the anchor)."""
    ex = examples(rows)
    on = lm_loss(calm, ex)
    with calm.gate_scale(0.0):
        off = lm_loss(calm, ex)
        answers_off = predictions(calm, ex, max_new_tokens=s.general_new_tokens)
    answers_on = predictions(calm, ex, max_new_tokens=s.general_new_tokens)
    return with_expected({"perplexity_on": on["perplexity"], "perplexity_off": off["perplexity"],
                          "ratio": on["perplexity"] / off["perplexity"],
                          "identical_answers": sum(a == b for a, b in zip(answers_on, answers_off)),
                          "prompts": len(rows), "answers": [{"question": r["question"], "bridge_on": a, "bridge_off": b}
                                                            for r, a, b in zip(rows, answers_on, answers_off)]})


def with_expected(general: dict) -> dict:
    """general_check's dict with the count of greedy answers that hold an expected word (general.EXPECTED), bridge
    on and off, and the questions where the two differ; computed from the stored answers, so older runs get it."""
    answers = general.get("answers") or []
    on = [holds_expected(a["question"], a["bridge_on"]) for a in answers]
    off = [holds_expected(a["question"], a["bridge_off"]) for a in answers]
    return dict(general, expected_on=sum(on), expected_off=sum(off),
                expected_lost=[a["question"] for a, x, y in zip(answers, on, off) if y and not x],
                expected_gained=[a["question"] for a, x, y in zip(answers, on, off) if x and not y])


def general_rows(general: dict) -> dict:
    """The table's two rows on the anchor's other abilities (CALM = bridge on, anchor alone = bridge off)."""
    g = with_expected(general)
    rows = {ROW_PERPLEXITY: {"CALM": g["perplexity_on"], "anchor alone": g["perplexity_off"]}}
    if g.get("answers"):
        rows[ROW_EXPECTED] = {"CALM": f"{g['expected_on']}/{len(g['answers'])}",
                              "anchor alone": f"{g['expected_off']}/{len(g['answers'])}"}
    return rows


def by_form(rows, preds, extract, style: str = "town") -> dict[str, float]:
    """% right per question form (the questions' templates, in world.QUESTIONS order): exact match on the value,
    or for sentence answers the value named (scoring.exact's rule)."""
    out = {}
    for form in sorted({r["form"] for r in rows}):
        pairs = [is_right(p, r, style == "sentence", extract) for r, p in zip(rows, preds) if r["form"] == form]
        out[QUESTIONS[rows[0]["attribute"]][form]] = 100.0 * sum(pairs) / len(pairs)
    return out


def compose_rows(data: dict, eos: str, style: str = "town") -> list[dict]:
    """The composition data: every question about the composition people (the answer in `style` + end of turn)
    and the rehearsal rows (end of turn only where the anchor ended)."""
    return [dict(r, completion=trained_answer(r["completion"], r["entity"], style) + eos)
            for r in data["questions"]] + data["rehearsal"]
