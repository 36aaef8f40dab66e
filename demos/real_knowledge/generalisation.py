"""Does the bridge generalise, and does it know what it does not know? One bridge scored on what it never saw.

    python -m demos.real_knowledge.generalisation presets/real_knowledge               # the shipped preset
    python -m demos.real_knowledge.generalisation RUN_DIR --people 60 --unknown 100    # any run folder

For a folder holding world.json, adapter/ and bridge/ (a run or the preset), with the bridge on and off:
- held-out people in the trained forms and in each never-trained form of probe_forms.NEVER_TRAINED
  (the same `--people` held-out people for every form);
- unknown people (invented names outside the world, and famous real people) asked in every form, trained or not:
  how often the answer names a town of the world (an invention), and for famous people how often it holds the
  expected word;
- the anchor's general prompts: perplexity of written answers and answers holding an expected word.
A held-out answer is right when the first town of the world it names is the person's ("named"); "exact" is the
stricter score of the table (the answer's first line is the town alone). Writes OUT/generalisation.json and .md
(`--split dev`: development people, probe_forms.DEV_FORMS and other unknown names -> generalisation_dev.*).
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch

from calm_core.training.data import Example
from calm_core.training.evaluation import predictions

from . import probe_forms as P
from .general import EVALUATION, holds_expected
from .scoring import answer, chat

TRAINED = "trained forms"


def first_town(text: str, towns: list[str]) -> str | None:
    """The first of `towns` the text names (whole words), or None."""
    hits = [(m.start(), t) for t in towns for m in [re.search(rf"\b{re.escape(t)}\b", text)] if m]
    return min(hits)[1] if hits else None


def load(folder: Path):
    """(ComposedLM, world dict) for a run or preset folder."""
    from calm_core import ComposedLM, load_causal_lm
    from calm_core.models.loading import freeze
    from calm_core.models.real_pair import prepared_pair

    from .bridge_training import load_augment

    pair = prepared_pair()
    if pair is None:
        raise SystemExit("The real pair is not prepared: python -m calm_core.models.real_pair")
    anchor = load_causal_lm(str(pair["smollm2"]))
    freeze(anchor[0].eval())
    m_a = load_augment(folder / "adapter", pair["gemma"])
    calm = ComposedLM.from_pretrained(folder / "bridge", anchor=anchor, augments=[m_a])
    return calm, json.loads((folder / "world.json").read_text())


def ask(calm, prompts: list[str], new_tokens: int, off: bool = True) -> dict[str, list[str]]:
    """Greedy answers with the bridge on (and off)."""
    rows = [Example(p, "") for p in prompts]
    got = {"on": predictions(calm, rows, max_new_tokens=new_tokens)}
    if off:
        with calm.gate_scale(0.0):
            got["off"] = predictions(calm, rows, max_new_tokens=new_tokens)
    return got


def trained_forms(world: dict) -> list[list[str]]:
    return [[q] for q in world["question_forms"]["town"]]


def held_out(calm, world: dict, people: int, new_tokens: int, split: str = "test") -> dict:
    """Per form: named and exact %, on the same people of `split`; bridge off (the anchor alone) in the trained
    forms. split "test": the reported never-trained forms; "dev": the development forms (choosing settings)."""
    tok, towns = calm.anchor.tokenizer, world["towns"]
    test = [p for p in world["people"] if p["split"] == split][:people]
    forms = {TRAINED: None, **(P.NEVER_TRAINED if split == "test" else P.DEV_FORMS)}
    out = {}
    for name, turns in forms.items():
        cases = [(p, (trained_forms(world)[i % 3] if turns is None else turns)) for i, p in enumerate(test)]
        got = ask(calm, [P.chat_prompt(tok, t, p["name"]) for p, t in cases], new_tokens, off=turns is None)
        out[name] = {"people": len(cases)}
        for side in got:
            named = [first_town(a, towns) == p["town"] for (p, _), a in zip(cases, got[side])]
            exact = [answer(a) == p["town"] for (p, _), a in zip(cases, got[side])]
            out[name][f"named_{side}"] = 100.0 * sum(named) / len(cases)
            out[name][f"exact_{side}"] = 100.0 * sum(exact) / len(cases)
        out[name]["examples"] = [{"question": P.question_text(t, p["name"]), "town": p["town"], "bridge_on": a}
                                 for (p, t), a in list(zip(cases, got["on"]))[:3]]
    return out


def unknown_asked(world: dict, count: int, split: str = "test") -> tuple[list[list[str]], list[str]]:
    """(every form, trained then the split's own; `count` invented names of the split) that unknown people are asked."""
    from . import world as W

    w = W.World(world["seed"], world["towns"], world["trades"],
                [W.Person(p["name"], p["town"], p["trade"]) for p in world["people"]])
    forms = trained_forms(world) + list((P.NEVER_TRAINED if split == "test" else P.DEV_FORMS).values())
    names = P.unknown_names(w, 2 * count)
    return forms, (names[:count] if split == "test" else names[count:])  # development: other names


def unknown(calm, world: dict, count: int, new_tokens: int, split: str = "test") -> dict:
    """Invented and famous people asked in every form in turn: answers naming a world town, bridge on and off."""
    tok, towns = calm.anchor.tokenizer, world["towns"]
    forms, invented = unknown_asked(world, count, split)
    out = {}
    for kind, names in (("invented", [(n, ()) for n in invented]), ("famous", P.FAMOUS)):
        cases = [(n, e, forms[i % len(forms)]) for i, (n, e) in enumerate(names)]
        got = ask(calm, [P.chat_prompt(tok, t, n) for n, _, t in cases], new_tokens)
        res = {"asked": len(cases)}
        for side in ("on", "off"):
            invented = [first_town(a, towns) is not None for a in got[side]]
            res[f"invented_{side}"] = 100.0 * sum(invented) / len(cases)
            if kind == "famous":
                res[f"expected_{side}"] = sum(any(e.lower() in a.lower() for e in exp)
                                              for (_, exp, _), a in zip(cases, got[side]))
        res["same_as_anchor"] = sum(a == b for a, b in zip(got["on"], got["off"]))
        res["examples"] = [{"question": P.question_text(t, n), "bridge_on": a, "bridge_off": b}
                           for (n, _, t), a, b in list(zip(cases, got["on"], got["off"]))[:6]]
        out[kind] = res
    return out


def general(calm, new_tokens: int) -> dict:
    """The 16 general prompts: perplexity of the written answers and expected words, bridge on and off."""
    from calm_core.training.evaluation import lm_loss

    tok = calm.anchor.tokenizer
    rows = [Example(chat(tok, q), a) for q, a in EVALUATION]
    on = lm_loss(calm, rows)["perplexity"]
    with calm.gate_scale(0.0):
        off = lm_loss(calm, rows)["perplexity"]
    got = ask(calm, [r.prompt for r in rows], new_tokens)
    return {"perplexity_on": on, "perplexity_off": off, "ratio": on / off,
            "expected_on": sum(holds_expected(q, a) for (q, _), a in zip(EVALUATION, got["on"])),
            "expected_off": sum(holds_expected(q, a) for (q, _), a in zip(EVALUATION, got["off"])),
            "prompts": len(rows)}


@torch.no_grad()
def contribution(calm, prompt: str) -> list[float]:
    """Per composition layer: how much the bridge changes the anchor's state at the answer's first token,
    |bridge update| / |anchor state| (0: the layer writes nothing there). Forward hooks, removed in finally."""
    blocks, seen = calm.bridge.blocks(), {}

    def hook(index):
        def record(module, inputs, output):
            if index not in seen:  # the prompt's pass; generation's later steps are ignored
                seen[index] = (output[0, -1].float().norm() / inputs[0][0, -1].float().norm()).item()
        return record

    handles = [b.register_forward_hook(hook(i)) for i, b in enumerate(blocks)]
    try:
        calm.generate([prompt], max_new_tokens=1)
    finally:
        for h in handles:
            h.remove()
    return [seen.get(i, 0.0) for i in range(len(blocks))]


def openings(calm, world: dict, people: int = 20) -> dict:
    """Mean per-layer contribution for held-out known people and invented unknown ones, each asked in the first
    trained form (the picture a student compares)."""
    from . import world as W

    tok = calm.anchor.tokenizer
    form = [world["question_forms"]["town"][1]]
    known = [p["name"] for p in world["people"] if p["split"] == "test"][:people]
    w = W.World(world["seed"], world["towns"], world["trades"], [W.Person(p["name"], p["town"], p["trade"])
                                                                 for p in world["people"]])
    out = {"layers": [f"anchor layer {b}" for _, b, _ in calm.layer_pairs()], "question": form[0]}
    for kind, names in (("known", known), ("unknown", P.unknown_names(w, people))):
        rows = [contribution(calm, P.chat_prompt(tok, form, n)) for n in names]
        out[kind] = [sum(col) / len(col) for col in zip(*rows)]
        # where the town is chosen: the answer written up to "NAME was born in" (m_A's fact phrase)
        rows = [contribution(calm, P.chat_prompt(tok, form, n) + f"{n} was born in") for n in names]
        out[f"{kind}_at_town"] = [sum(col) / len(col) for col in zip(*rows)]
    return out


def openings_figure(op: dict):
    """Grouped bars: per composition layer, the bridge's share of the anchor state, known vs unknown people."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = [("", "at the answer's first token")]
    if "known_at_town" in op:
        panels.append(("_at_town", "where the town is chosen (after 'NAME was born in')"))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for _, t in panels], shared_yaxes=True)
    for col, (suffix, _) in enumerate(panels, start=1):
        for kind, label, color in (("known", "a held-out person m_A read about", "#1f77b4"),
                                   ("unknown", "an invented name m_A never read about", "#ff7f0e")):
            fig.add_trace(go.Bar(name=label, x=op["layers"], y=op[kind + suffix], marker_color=color,
                                 showlegend=col == 1), row=1, col=col)
    fig.update_layout(barmode="group", template="plotly_white", width=520 * len(panels), height=440,
                      title=f"How much each composition layer changes the anchor's state<br>"
                            f"<sub>|bridge update| / |anchor state|, mean over 20 people, asked '{op['question'].replace('{x}', 'NAME')}'</sub>",
                      yaxis_title="bridge update / anchor state", legend=dict(orientation="h", y=-0.18))
    return fig


def markdown(result: dict) -> str:
    lines = ["| question form | people | named, bridge on | exact, bridge on | named, bridge off |", "|---|---|---|---|---|"]
    for name, r in result["held_out"].items():
        off = f"{r['named_off']:.1f}" if "named_off" in r else "-"
        lines.append(f"| {name} | {r['people']} | {r['named_on']:.1f} | {r['exact_on']:.1f} | {off} |")
    never = [r for n, r in result["held_out"].items() if n != TRAINED]
    lines.append(f"| **never-trained forms, all** | {sum(r['people'] for r in never)} | "
                 f"**{sum(r['named_on'] for r in never) / len(never):.1f}** (lowest {min(r['named_on'] for r in never):.1f}) "
                 f"| {sum(r['exact_on'] for r in never) / len(never):.1f} | |")
    u, g = result["unknown"], result["general"]
    lines += ["", "| unknown people | asked | answers naming a world town, bridge on | bridge off | answers equal to the anchor's |",
              "|---|---|---|---|---|"]
    for kind, r in u.items():
        lines.append(f"| {kind} | {r['asked']} | {r['invented_on']:.1f}% | {r['invented_off']:.1f}% | {r['same_as_anchor']} |")
    op = result.get("openings")
    if op:
        lines += ["", "| bridge update / anchor state at the answer | " + " | ".join(op["layers"]) + " |",
                  "|---|" + "---|" * len(op["layers"])]
        for key in ("known", "unknown", "known_at_town", "unknown_at_town"):
            if key in op:
                where = " (where the town is chosen)" if key.endswith("_at_town") else ""
                lines.append(f"| {key.split('_')[0]} people{where} | " + " | ".join(f"{v:.3f}" for v in op[key]) + " |")
    f = u["famous"]
    lines += ["", f"Famous people, answers holding the expected town or country: {f['expected_on']}/{f['asked']} with "
              f"the bridge, {f['expected_off']}/{f['asked']} without. General prompts: perplexity ratio "
              f"{g['ratio']:.3f} ({g['perplexity_on']:.2f} / {g['perplexity_off']:.2f}), expected words "
              f"{g['expected_on']}/{g['prompts']} with the bridge, {g['expected_off']}/{g['prompts']} without."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", help="a run or preset folder (world.json, adapter/, bridge/)")
    ap.add_argument("--people", type=int, default=60, help="held-out people per question form")
    ap.add_argument("--unknown", type=int, default=100, help="invented unknown names")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--out", default=None, help="folder for generalisation.json/.md (default: the folder)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--split", choices=("test", "dev"), default="test", help="test: held-out people, the reported "
                    "never-trained forms; dev: development people and forms, for choosing settings")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = Path(args.folder)
    t = time.perf_counter()
    calm, world = load(folder)
    result = {"folder": str(folder), "split": args.split,
              "held_out": held_out(calm, world, args.people, args.new_tokens, args.split),
              "unknown": unknown(calm, world, args.unknown, args.new_tokens, args.split), "general": general(calm, 24)}
    result["openings"] = openings(calm, world)
    result["seconds"] = time.perf_counter() - t
    out = Path(args.out or folder)
    out.mkdir(parents=True, exist_ok=True)
    name = "generalisation" if args.split == "test" else "generalisation_dev"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    (out / f"{name}.md").write_text(markdown(result))
    openings_figure(result["openings"]).write_html(out / f"{name}_openings.html", include_plotlyjs="cdn")
    print(markdown(result))
    print(f"{result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
