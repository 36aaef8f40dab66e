"""The paper's Table 1 beside ours, labelled with what each side measured: JSON, markdown and a plotly figure.

Our table and the paper's are not the same measurement (issue 18): the protocol, the answer format and
the departures from the paper are written into every file next to the paper's numbers (`protocol`,
`answer_formats`, `column_notes`, `departures`, `checks` in table.json). `relabel(out_dir)` rewrites the
labels and the three files from an existing table.json without recomputing anything
(`python -m demos.kv_arithmetic.report presets/kv_arithmetic`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from demos.fresh_runs import shipped_runs

ROWS = ["KV-SUBS", "NUM-MATH", "KV-MATH (held-out keys)", "KV-MATH (train keys)"]
COLUMNS = ["m_A", "m_B", "CALM", "m_B fine-tuned (20% keys)", "CALM with random m_A"]
PAPER_COLUMNS = ["paper m_A", "paper m_B", "paper CALM"]
# Table 1 of the paper (accuracy %); the paper reports no KV-MATH on training keys nor these controls.
PAPER_TABLE = {
    "KV-SUBS": {"m_A": 98.1, "m_B": 0.0, "CALM": 92.9},
    "NUM-MATH": {"m_A": 4.2, "m_B": 73.7, "CALM": 72.0},
    "KV-MATH (held-out keys)": {"m_A": 0.7, "m_B": 0.0, "CALM": 84.3},
}
PAPER_PROTOCOL = ("pretrained PaLM2 models trained plainly (m_A on KV-SUBS, m_B as it is), composition "
                  "on KV-SUBS over 20% of 25K keys (no arithmetic in its composition data), evaluation on KV-MATH "
                  "over held-out keys answered with the number alone, 3-6 keys with +, - and x")
# Measured on the shipped preset's models after its table was made (issue 18); relabel() keeps a table.json's own.
SHIPPED_CHECKS = [
    "Fresh expressions over held-out keys, checked from outside (issue 18): CALM 95-98%, the anchor alone "
    "0-0.2%, no key knowledge leaking into m_B.",
    "Given the correctly restated prompt (`k1+k2=v1+v2=`), the anchor alone (gate 0) gets 97.5% of results "
    "right on fresh expressions (issue 18; 98.0% on this table's 300 held-out expressions): what the bridge "
    "contributes is the substitution (KV-SUBS: CALM 97.3%), the arithmetic is the anchor's.",
    "Asked for the number directly, in the paper's KV-MATH answer format (`k1+k2=` -> `246`), the shipped "
    "composition scores 0% (issue 18; 0 of the first 60 held-out expressions here): it always restates the "
    "values first (`93+153=246`).",
]


def _restates(settings: dict) -> bool:
    return bool(settings.get("anchor_restate", True))


def _paper(settings: dict) -> bool:
    """A run of the paper's protocol (settings.PAPER): plain base models, composition on KV-SUBS."""
    return settings.get("protocol") == "paper"


def _ablation(settings: dict) -> str:
    """What an ablation run removes from the preset ("" for none)."""
    from .settings import ABLATIONS

    name = settings.get("ablation") or ""
    return ABLATIONS[name][0] if name in ABLATIONS else name


def _built_for_bridge(s: dict) -> list[str]:
    """The ingredients of ours that a run's base models have (the paper's have none)."""
    have = [("value heads", s.get("augment_value_layers", [2, 3]) or s.get("anchor_value_layers", [])),
            ("digit embeddings", s.get("digit_embeddings", True)),
            ("the merged-word slot", s.get("anchor_merged", 0.3)), ("labelled operands", s.get("anchor_labels", 0.2)),
            ("restating", _restates(s)), ("operand noise", s.get("anchor_operand_noise", 0.3)),
            ("lookups in m_A's data", s.get("augment_lookups", 0.3))]
    return [name for name, on in have if on]


def _layout(s: dict) -> str:
    window = s.get("compose_window", 1)
    seen = "all m_A states so far" if not window else f"the newest {window} m_A state(s)"
    if s.get("compose_every"):
        return f"blocks at every {s['compose_every']} layers of both models (every={s['compose_every']}, insert={s.get('compose_insert')}), seeing {seen}"
    return f"anchor layers {s.get('compose_anchor_layers')} <- m_A layers {s.get('compose_augment_layers')}, seeing {seen}"


def protocol(settings: dict | None = None) -> str:
    """A short text: what our table measured, and how the paper's differs (details: departures())."""
    s = settings or {}
    keys, operands, share = s.get("keys", 500), s.get("operands", 2), s.get("train_share", 0.2)
    if _paper(s):
        extra = _built_for_bridge(s)
        return (f"The paper's protocol, on models from scratch: m_A trained on KV-SUBS only, m_B on NUM-MATH only "
                f"({'with ' + ', '.join(extra) + ' added' if extra else 'nothing built for the bridge'}); the bridge "
                f"({_layout(s)}) trained on KV-SUBS over {share:.0%} of {keys} keys ({operands} operands, + and -; no "
                f"arithmetic); KV-MATH over held-out keys, greedy, scored on the whole answer (the number alone). "
                f"The paper's numbers: pretrained PaLM2 models, 25K keys, 3-6 operands with +, - and x: for "
                f"reference, not a target met or beaten.")
    answer = "`k1+k2=` -> `v1+v2=r`" if _restates(s) else "`k1+k2=` -> `r`"
    scored = "scored on r, the result after the restated values" if _restates(s) else "scored on r"
    ablation = f"Ablation of the preset, {_ablation(s)}. " if _ablation(s) else ""
    return (f"{ablation}Ours: bridge trained on {answer} over {share:.0%} of {keys} keys ({operands} operands, + and -), "
            f"base models from scratch and built for the bridge; greedy answers over held-out keys, {scored}. "
            f"The paper: composition on KV-SUBS (no arithmetic), KV-MATH answered with the number alone, plain "
            f"pretrained PaLM2 models, 25K keys, 3-6 operands with +, - and x. Not the same protocol: the paper's "
            f"numbers are for reference, not a target met or beaten." + ("" if s.get("seed") or ablation else _fresh_short()))


def _fresh_short() -> str:
    runs = fresh_tables()
    return (" Seed 0's held-out keys chose two settings (a development set); on fresh key tables, each run once: "
            + ", ".join(f"{value:.1f}%" for _, value, _ in runs) + " (results/kv_arithmetic)." if runs else "")


def answer_formats(settings: dict | None = None) -> dict:
    """row -> {"ours": prompt -> answer (what is scored), "paper": the paper's prompt -> answer}."""
    s = settings or {}
    shown = "`ab+xyz=` -> `95+22=117`, scored on `117`" if _restates(s) else "`ab+xyz=` -> `117`"
    subs = "`ab+xyz=` -> `95+22` (scored on the text before the answer's first '=')"
    if s.get("whole_answers"):
        shown = "`ab+xyz=` -> `117` (the whole answer: the number alone)"
        subs = f"`ab+xyz{s.get('kv_subs_end', '=')}` -> `95+22` (the whole answer)"
    trained = "composed on KV-SUBS over these keys" if s.get("composition") == "kv_subs" else "trained on these keys"
    return {
        "KV-SUBS": {"ours": subs, "paper": "`<K1>+<K2>-<K3>` -> `10+22-24`"},
        "NUM-MATH": {"ours": "`95+22=` -> `117`", "paper": "`10+22-24` -> `8` (3-6 operands, +, -, x)"},
        "KV-MATH (held-out keys)": {"ours": shown, "paper": "`<K1>+<K2>-<K3>` -> `8` (the number alone)"},
        "KV-MATH (train keys)": {"ours": shown + f"; the bridge {trained} (other expressions)",
                                 "paper": "not reported"},
    }


def column_notes(settings: dict | None = None) -> dict:
    """column -> what that model is; the paper's columns say that they come from another protocol."""
    s = settings or {}
    layers, width = s.get("augment_layers", 4), s.get("width", 128)
    digits = s.get("digit_embeddings", True)
    heads = ("value heads (training-only read-outs of each key's value where the bridge reads)"
             if s.get("augment_value_layers", [2, 3]) else "")
    with_a = " and ".join(x for x in (heads, "digit embeddings" * digits) if x) or "neither value heads nor digit embeddings"
    if s.get("anchor_merged", 0.3):
        skill = "trained to take a value injected on a word and to answer such an expression by restating its values (`qw+22=` -> `95+22=117`)"
    elif _restates(s) and s.get("anchor_labels", 0.2):
        skill = "never given a value injected on a word; answers expressions with labelled operands by restating them (`qw95+22=` -> `95+22=117`)"
    else:
        skill = "trained on plain NUM-MATH (`95+22=` -> `117`)"
    if _paper(s):
        m_a = f"augmenting model, {layers}x{width}, from scratch on KV-SUBS only (`ab+xyz{s.get('kv_subs_end', '=')}` -> `95+22`), with {with_a}"
        calm = (f"the paper's bridge: {_layout(s)}, {s.get('gate', 'channel')} gate; trained on KV-SUBS over the "
                f"training keys (no arithmetic)")
    else:
        m_a = (f"augmenting model, {layers}x{width}, from scratch on formats of the key table only (KV-SUBS, "
               f"lookups), with {with_a}")
        window = ("window=1 (each anchor token sees only the m_A state aligned with it)" if s.get("compose_window", 1) == 1
                  else f"window={s.get('compose_window')} ({_layout(s).split(', seeing ')[1]})")
        calm = (f"bridge into m_B's token embeddings from m_A's last layer, {window}, null slot, channel gate, noise "
                f"on m_A's states while it trains; trained on the composition file (KV-MATH over the training keys "
                f"in m_B's restating format, + 20% NUM-MATH)")
    return {
        "m_A": m_a,
        "m_B": (f"anchor, {s.get('anchor_layers', 4)}x{width}, from scratch on arithmetic only (never a key), "
                f"{'with digit embeddings' if digits else 'free number embeddings'}, {skill}{_trained_on(s)}"),
        "CALM": calm,
        "m_B fine-tuned (20% keys)": "m_B fully fine-tuned on the same composition file (control)",
        "CALM with random m_A": "the same bridge on a randomly initialised m_A (control)",
        "paper m_A": "the paper's Table 1, its protocol: a pretrained PaLM2 model trained on KV-SUBS",
        "paper m_B": "the paper's Table 1, its protocol: a pretrained PaLM2 model as it is",
        "paper CALM": ("the paper's Table 1, its protocol: composed on KV-SUBS over 20% of 25K keys, KV-MATH "
                       "answered with the number alone; not comparable cell by cell with ours"),
    }


def _trained_on(s: dict) -> str:
    """m_B's training length: fixed, or extended until it computes (settings.anchor_min_num_math, absent in
    runs made before it)."""
    check, steps = s.get("anchor_min_num_math", 0.0), s.get("anchor_steps", 1500)
    if not check:
        return f"; {steps} steps"
    return (f"; {steps} steps, then {steps} more (at most {s.get('anchor_extra_rounds', 2)} times) while it computes "
            f"under {check:.0%} of its own NUM-MATH probe")


RESULTS = Path(__file__).parents[2] / "results" / "kv_arithmetic"  # data lives outside the code folder


def fresh_tables() -> list[tuple[int, float, bool]]:
    """(seed, CALM KV-MATH % on held-out keys, m_B checked before composing) of the shipped fresh-key-table runs (results/kv_arithmetic/kv_seedN), each run
    once with the settings frozen: the numbers to set beside seed 0's, whose held-out keys were a development set."""
    # anchor_min_num_math absent: a run from before m_B was checked
    return [(run["settings"]["seed"], run["table"]["KV-MATH (held-out keys)"]["CALM"],
             run["settings"].get("anchor_min_num_math", 0.0) > 0) for run in shipped_runs(RESULTS, "kv_seed")]


def departures(settings: dict | None = None) -> list[str]:
    """How our measurement differs from the paper's, one item each."""
    s = settings or {}
    scale = (f"Scale: {s.get('operands', 2)} operands with + and -, {s.get('keys', 500)} keys; the paper: 3-6 keys with "
             f"+, - and x, 25K keys.")
    seed = s.get("seed", 0)
    held = ("Held-out keys as a development set: they chose the bridge's learning rate and `anchor_given`, so the "
            "held-out rows are not a test set used once." + _fresh() if not seed else
            f"A test set used once: seed {seed} draws a fresh key table, split and expressions; the settings were "
            f"frozen on seed 0, whose held-out keys chose the bridge's learning rate and `anchor_given`.")
    if _paper(s):
        end = s.get("kv_subs_end", "=")
        prompts = (f"Prompts: KV-SUBS prompts end with `{end}` (`ab+xyz{end}` -> `95+22`), KV-MATH prompts with `=`; "
                   f"the paper writes one prompt for both, and with one prompt, composing on KV-SUBS teaches the "
                   f"composed model to answer a KV-MATH prompt with the substitution." if end != "=" else
                   "Prompts: KV-SUBS and KV-MATH share the prompt `ab+xyz=`, as the paper writes them: composing on "
                   "KV-SUBS teaches the composed model to answer a KV-MATH prompt with the substitution.")
        return [
            f"Base models: from scratch ({s.get('augment_layers', 4)}x{s.get('width', 128)}), not pretrained PaLM2 "
            f"models: m_B knows only NUM-MATH; the shared tokenizer makes each operand one token.",
            prompts,
            f"Bridge: {_layout(s)}, {s.get('gate', 'channel')} gate (the paper: a plain residual add, every 4th "
            f"layer of much deeper models).",
            scale, held if seed else "Held-out keys of seed 0: the preset's development set (they chose its bridge "
            "learning rate), so the held-out rows are not a test set used once: see a run with another seed."]
    fmt_ours = ("restated expressions with results (`k1+k2=` -> `v1+v2=r`), so the composition data also teach "
                "the arithmetic answer" if _restates(s) else "KV-MATH answered with the result (`k1+k2=` -> `r`)")
    items = [
        f"Composition data: the paper composes on KV-SUBS over 20% of the keys (no arithmetic: `<K1>+<K2>-<K3>` "
        f"-> `10+22-24`) and evaluates on KV-MATH (expression -> number); ours composes on {fmt_ours}, and the "
        f"KV-MATH rows score the result after the restated values.",
        "Base models: the paper's are pretrained PaLM2 models trained plainly (m_A on KV-SUBS, m_B as it is); ours "
        "were built for the bridge: value heads trained on every key's value at the position the bridge reads, "
        "digit embeddings in both models, an anchor trained to accept an injected value on a word, and window=1.",
        scale, held,
    ]
    return ([f"This run is an ablation, {_ablation(s)}; the rest as the preset."] if _ablation(s) else []) + items


def _fresh() -> str:
    runs = fresh_tables()
    return (" Fresh key tables, each run once with the settings frozen (results/kv_arithmetic): " +
            ", ".join(f"seed {seed} {value:.1f}%" + (" (m_B checked)" if checked else "") for seed, value, checked in runs)
            + " on held-out keys; m_B checked: trained on until it computes its own NUM-MATH probe, a setting added "
            "after seeds 1-2." if runs else "")


def labels(settings: dict | None = None, checks: list[str] | None = None) -> dict:
    """The label fields of table.json."""
    return {"protocol": protocol(settings), "answer_formats": answer_formats(settings),
            "column_notes": column_notes(settings), "departures": departures(settings), "checks": list(checks or [])}


def fmt(v) -> str:
    return "–" if v is None else f"{v:.1f}"


def markdown(table: dict, paper: dict = PAPER_TABLE, settings: dict | None = None,
             checks: list[str] | None = None) -> str:
    """table: row -> column -> accuracy % (None where not measured). The table with what each row asked and
    how the answer was scored, ours and the paper's, then the protocol, the departures, checks and column notes."""
    formats, notes = answer_formats(settings), column_notes(settings)
    head = ("| data set | ours: prompt -> answer | " + " | ".join(COLUMNS)
            + " | the paper's protocol: prompt -> answer | " + " | ".join(f"{c} ¹" for c in PAPER_COLUMNS) + " |")
    lines = [head, "|" + "---|" * (len(COLUMNS) + 6)]
    for row in ROWS:
        ours = table.get(row, {})
        ref = paper.get(row, {})
        cells = ([formats[row]["ours"]] + [fmt(ours.get(c)) for c in COLUMNS] + [formats[row]["paper"]]
                 + [fmt(ref.get(c)) for c in ("m_A", "m_B", "CALM")])
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", "¹ The paper's Table 1 under its own protocol (" + PAPER_PROTOCOL + "): not the same "
              "measurement as ours: context, not a target that ours meets or beats.", "",
              "**What was measured.** " + protocol(settings), "", "**Departures from the paper:**", ""]
    lines += [f"- {d}" for d in departures(settings)]
    if checks:
        lines += ["", "**Measured on the same models after this table:**", ""] + [f"- {c}" for c in checks]
    lines += ["", "**Columns:**", ""] + [f"- {c}: {n}" for c, n in notes.items()]
    return "\n".join(lines)


def table_figure(table: dict, paper: dict = PAPER_TABLE, title: str = "Key-value arithmetic: accuracy (%)",
                 settings: dict | None = None):
    """Grouped bars per data set: our models and controls beside the paper's Table 1 (hatched: its own protocol)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    colors = {"m_A": "#8da0cb", "m_B": "#66c2a5", "CALM": "#fc8d62",
              "m_B fine-tuned (20% keys)": "#a6d854", "CALM with random m_A": "#b3b3b3"}
    for col in COLUMNS:
        ys = [table.get(r, {}).get(col) for r in ROWS]
        fig.add_bar(name=col, x=ROWS, y=ys, marker_color=colors.get(col),
                    text=[fmt(y) for y in ys], textposition="outside")
    for col, dash in (("m_A", "#3b4f8a"), ("m_B", "#2a7a62"), ("CALM", "#b5461f")):
        ys = [paper.get(r, {}).get(col) for r in ROWS]
        fig.add_bar(name=f"paper {col} (its protocol)", x=ROWS, y=ys, marker_color="rgba(0,0,0,0)",
                    marker_line_color=dash, marker_line_width=2, marker_pattern_shape="/",
                    text=[fmt(y) if y is not None else "" for y in ys], textposition="outside")
    subtitle = ("ours: composed on k1+k2= -> v1+v2=r, scored on r; the paper (hatched): composed on KV-SUBS, "
                "KV-MATH answered with the number: not the same protocol")
    if _paper(settings or {}):
        subtitle = ("the paper's protocol on models from scratch: composed on KV-SUBS, KV-MATH scored on the number "
                    "alone; the paper (hatched): PaLM2 models, 25K keys")
    fig.update_layout(barmode="group", title=f"{title}<br><sup>{subtitle}</sup>",
                      yaxis=dict(title="accuracy (%)", range=[0, 110]),
                      legend=dict(orientation="h", y=-0.2), template="plotly_white", height=520)
    return fig


def save(table: dict, out_dir, meta: dict | None = None, checks: list[str] | None = None) -> dict:
    """table.json, table.md and table.html in out_dir, labelled from meta["settings"]; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(meta or {})
    settings = meta.get("settings")
    payload = {"table": table, "paper_table": PAPER_TABLE, **labels(settings, checks), **meta}
    (out / "table.json").write_text(json.dumps(payload, indent=2))
    (out / "table.md").write_text(markdown(table, settings=settings, checks=checks) + "\n")
    table_figure(table, settings=settings).write_html(out / "table.html", include_plotlyjs="cdn")
    return {"json": str(out / "table.json"), "markdown": str(out / "table.md"), "html": str(out / "table.html")}


LABEL_FIELDS = ("paper_table", "protocol", "answer_formats", "column_notes", "departures", "checks")


def relabel(out_dir, checks: list[str] | None = None) -> dict:
    """Rewrite table.json / .md / .html in out_dir from its table.json: the measured numbers and every other
    field as they are, the labels from this module (checks: given, or those the file already has)."""
    old = json.loads((Path(out_dir) / "table.json").read_text())
    checks = old.get("checks", []) if checks is None else checks
    meta = {k: v for k, v in old.items() if k != "table" and k not in LABEL_FIELDS}
    return save(old["table"], out_dir, meta, checks)


if __name__ == "__main__":  # python -m demos.kv_arithmetic.report DIR [--shipped-checks]
    relabel(sys.argv[1], SHIPPED_CHECKS if "--shipped-checks" in sys.argv[2:] else None)
