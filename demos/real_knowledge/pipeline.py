"""Knowledge through the bridge with the real pair: world -> m_A (LoRA) -> composition -> controls -> table -> preset.

    python -m demos.real_knowledge --out DIR               # dev world (seed 0): settings were chosen on it
    python -m demos.real_knowledge --seed 1 --out DIR      # a fresh world, run once with the settings frozen
    python -m demos.real_knowledge --smoke --out /tmp/rk   # the whole pipeline at a tiny size (tests)
    python -m demos.real_knowledge --reuse-augment DIR/adapter ...   # skip m_A's training
    python -m demos.real_knowledge --reuse-augment DIR/adapter --reuse-bridge DIR ...   # and the bridge's (its
                                                                 # training record comes from DIR/table.json)
    python -m demos.real_knowledge --seed 1 --augment-only --set augment_lr=3e-3 --out DIR   # m_A alone

Anchor (frozen, never sees the world): SmolLM2-135M-Instruct, a chat model, asked in its own chat template.
m_A: Gemma 3 270M (base) + a LoRA adapter trained on the world's encyclopedia sentences only.
Every score is exact match on the value (the answer's first line, surrounding spaces and a final full stop
removed), greedy, batched (calm_core.training.evaluation.predictions); with --set answer_style='"sentence"' (the
shipped preset's: the answer is "NAME was born in TOWN.") the town named in the first line.

Steps: 1. world and data (the trained forms, or phrasings.py's grammar past 3 per person; unknown_rows; rehearsal);
2. m_A's LoRA (or --reuse-augment; --set augment_unknown=N also teaches N names outside the world as unknown,
not_recorded.py, and augment_resume='"DIR"' continues an adapter), then m_A alone probed on known and invented
names; 3. the bridge (value map, recency start, development checks); 4. evaluation;
5. the trained controls; 6. table and preset.json. Then: python -m demos.real_knowledge.generalisation DIR
(other wordings, unknown people) and python -m demos.real_knowledge.invention_source DIR (whose mistakes).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from calm_core import load_causal_lm
from calm_core.lab.model_cache import fast_bf16
from calm_core.models.loading import freeze, load_tokenizer
from calm_core.models.real_pair import prepared_pair
from calm_core.training.evaluation import as_composed, predictions

from . import augment as A
from . import general as G
from . import not_recorded as NR
from . import phrasings as PH
from . import scoring as S
from . import world as W
from .augment import log
from .bridge_training import finetune_anchor, load_augment, train_bridge
from .probe_forms import chat_prompt as chat_turns
from .reuse import reused_augment, reused_finetune
from .scoring import (  # noqa: F401 (COLUMNS: tests)
    COLUMNS,
    FT,
    ROW_DEV,
    ROW_SEEN,
    ROW_TEST,
    chat,
    exact,
    examples,
    general_check,
    general_rows,
    starts_with_answer,
)
from .settings import Settings

# ---- 1. the world and the data --------------------------------------------------------------

def pieces(tok, text: str) -> list[str]:
    """text's tokens as the strings they stand for (" Stok", "air", "un")."""
    return [tok.convert_tokens_to_string([t]) for t in tok.tokenize(text)]


def make_world(s: Settings, anchor_tok, augment_tok) -> W.World:
    """The seeded world; every town starts with a token of its own in both tokenizers and, with s.same_split,
    is cut into the same pieces by both: m_A's next token at each position of the answer is then the anchor's."""
    same = (lambda t: pieces(anchor_tok, " " + t) == pieces(augment_tok, " " + t)) if s.same_split else None
    return W.make_world(s.seed, s.entities, s.towns, first_token=[lambda t: anchor_tok.tokenize(" " + t)[0],
                                                                  lambda t: augment_tok.tokenize(" " + t)[0]], keep=same)


def make_data(s: Settings, world: W.World, anchor_tok) -> dict:
    parts = W.split(world, s.compose_fraction, s.dev, s.seed)

    def ask(people, every_form: bool, limit=None):
        out = []
        for i, p in enumerate(people[:limit]):
            for a in s.attributes:
                qs = world.questions(p, a)
                for k, q in enumerate(qs):
                    if every_form or k == i % len(qs):
                        out.append({"prompt": chat(anchor_tok, q), "completion": p.value(a), "question": q,
                                    "form": k, "entity": p.name, "attribute": a})
        return out

    questions = ask(parts["compose"], True)
    if s.questions_per_person > 3:  # the trained forms plus forms drawn from the grammar (town only)
        questions = [{"prompt": chat_turns(anchor_tok, turns, p.name), "completion": p.town,
                      "question": turns[-1].format(x=p.name), "form": -1, "entity": p.name, "attribute": "town"}
                     for p, turns in PH.questions(parts["compose"], s.questions_per_person, s.seed)]
    return {
        "world": world, "parts": parts, "facts": world.fact_phrasings(s.attributes),
        "questions": questions,
        "dev": ask(parts["dev"], False, s.eval_dev),
        "test": ask(parts["test"], False, s.eval_test),
        "seen": ask(parts["compose"], False, s.eval_seen),
        "completion_test": [{"prompt": W.COMPLETION[a].format(x=p.name), "completion": p.value(a), "entity": p.name,
                             "attribute": a} for p in parts["test"][:s.eval_test] for a in s.attributes],
        "general": [{"prompt": chat(anchor_tok, q), "completion": r, "question": q}
                    for q, r in G.EVALUATION[:s.general_prompts]],
    }


def rehearsal_rows(s: Settings, anchor) -> list[dict]:
    """General questions (none of the evaluation ones) answered by the anchor itself, greedy; an answer that
    ended within rehearsal_new_tokens ends with the end-of-turn token, one cut there does not (training adds
    no end-of-turn of its own: see compose_rows). With s.rehearsal_kl the answer is trained toward the anchor's
    own next-token distributions (Example.keep_anchor), not toward its greedy tokens."""
    questions = G.rehearsal(s.rehearsal, s.seed)
    return anchor_answers(s, anchor, [{"prompt": chat(anchor[1], q), "completion": "", "question": q} for q in questions])


def unknown_rows(s: Settings, anchor, world: W.World) -> list[dict]:
    """Questions about invented names outside the world with the anchor's own answers as targets (keep_anchor):
    where m_A knows nobody, the composition should answer as the anchor alone does; with unknown_answer
    "not_recorded", the sentence an m_A taught names outside the world says ("NAME was born in an unknown town.")."""
    tok = anchor[1]
    if s.unknown_rows > NR.BRIDGE_NAMES:
        raise SystemExit(f"unknown_rows is at most {NR.BRIDGE_NAMES} (the names kept apart from m_A's outside names)")
    asked = PH.unknown_questions(world, s.unknown_rows, s.seed)
    rows = [{"prompt": chat_turns(tok, turns, name), "completion": "", "question": turns[-1].format(x=name)}
            for name, turns in asked]
    if s.unknown_answer == "not_recorded":  # m_A's own answer for a name it never read about (not_recorded.py)
        return [dict(r, completion=NR.sentence(name) + tok.eos_token, keep_anchor=False, not_recorded=True)
                for r, (name, _) in zip(rows, asked)]
    if s.unknown_answer != "anchor":
        raise SystemExit(f"unknown_answer is 'anchor' or 'not_recorded', not {s.unknown_answer!r}")
    return anchor_answers(s, anchor, rows)


def anchor_answers(s: Settings, anchor, rows: list[dict]) -> list[dict]:
    """rows with the anchor's own greedy answers as completions, trained toward its distributions (keep_anchor)."""
    tok = anchor[1]
    answers = predictions(as_composed(*anchor), examples(rows), max_new_tokens=s.rehearsal_new_tokens)
    for r, a in zip(rows, answers):
        ended = len(tok(a, add_special_tokens=False)["input_ids"]) < s.rehearsal_new_tokens
        r["completion"] = a + (tok.eos_token if ended else "")
        r["keep_anchor"] = s.rehearsal_kl
    return [r for r in rows if r["completion"].strip()]


# ---- 2. the whole run -----------------------------------------------------------------------


def train_augment(s: Settings, pair, data, adapter: Path) -> dict:
    """m_A's adapter in `adapter` (trained, or copied from --reuse-augment) and its training log."""
    if s.reuse_augment:
        return reused_augment(Path(s.reuse_augment), adapter)
    gemma, gtok = load_causal_lm(str(pair["gemma"]))
    probe = [f[0] for f in data["facts"][::max(1, len(data["facts"]) // 100)]]
    extra = NR.extra_facts(s, data["world"])
    common = dict(rank=s.lora_rank, alpha=s.lora_alpha, lr=s.augment_lr, batch_size=s.augment_batch,
                  max_minutes=s.augment_minutes, target_recall=s.target_recall, seed=s.seed, save_dir=adapter,
                  pack=s.augment_pack, bf16=s.augment_bf16, log_path=adapter / "augment_log.jsonl",
                  loraplus_ratio=s.augment_loraplus, anneal_at=s.augment_anneal_at)
    later = bool(s.augment_unknown_epochs and extra)  # the outside names in a second stage (NR.second_stage)
    model, hist = A.train_lora(gemma, gtok, data["facts"] + ([] if later else extra), probe, **common,
                               max_epochs=s.augment_epochs, focus_fraction=s.augment_focus,
                               focus_epochs=s.augment_focus_epochs, anneal_epochs=s.augment_anneal_epochs,
                               resume=Path(s.augment_resume) if s.augment_resume else None)
    if later:
        model, more = A.train_lora(model.unload(), gtok, data["facts"] + extra, probe, **common, resume=adapter,
                                   **NR.second_stage(s))
        hist += [dict(e, continued=True) for e in more]
    info = {"history": hist, "probe": NR.probe_run(model, gtok, data, s.eval_dev)}
    # kept with the adapter (a run that reuses it copies the folder): what m_A read beside the world, and how it answers
    (adapter / "augment.json").write_text(json.dumps({
        "unknown_names": s.augment_unknown, "famous_known": s.augment_famous, "continued_from": s.augment_resume,
        "probe": info["probe"],
        "settings": {k: v for k, v in asdict(s).items() if k.startswith(("augment_", "lora_", "entities", "towns"))}},
        indent=1))
    return info


def evaluate_composition(s: Settings, calm, m_a, data) -> tuple[dict, dict, dict, dict]:
    """(table, predictions, exact match by question form, general check): CALM, the anchor alone and m_A alone."""
    table, preds = {ROW_TEST: {}, ROW_DEV: {}, ROW_SEEN: {}}, {}
    for row, key in ((ROW_TEST, "test"), (ROW_DEV, "dev"), (ROW_SEEN, "seen")):
        table[row]["CALM"], preds[f"CALM/{key}"] = exact(calm, data[key], s)
    with calm.gate_scale(0.0):
        table[ROW_TEST]["anchor alone"], preds["anchor/test"] = exact(calm, data["test"], s)
        table[ROW_SEEN]["anchor alone"], _ = exact(calm, data["seen"], s)
    m_a_alone = as_composed(*m_a)
    table[ROW_TEST]["m_A alone (chat question)"], preds["m_A/test"] = exact(m_a_alone, data["test"], s)
    table[ROW_TEST]["m_A alone (best prompt)"], preds["m_A best/completion_test"] = starts_with_answer(
        m_a_alone, data["completion_test"], s)
    forms = {"CALM": S.by_form(data["test"], preds["CALM/test"], S.answer, s.answer_style)}
    return table, preds, forms, general_check(calm, data["general"], s)


def run(s: Settings, out: Path, augment_only: bool = False) -> dict:
    from . import preset_files, report

    torch.set_num_threads(s.threads)
    native = fast_bf16("cpu")
    s.augment_bf16 = native if s.augment_bf16 is None else s.augment_bf16
    s.compose_bf16 = native if s.compose_bf16 is None else s.compose_bf16
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pair = prepared_pair()
    if pair is None:
        raise SystemExit("The real pair is not prepared: python -m calm_core.models.real_pair")
    if s.reuse_table and not s.reuse_bridge:
        raise SystemExit("reuse_table needs reuse_bridge (the run whose table.json it keeps)")
    times, t0 = {}, time.perf_counter()
    anchor = load_causal_lm(str(pair["smollm2"]))
    freeze(anchor[0].eval())
    world = make_world(s, anchor[1], load_tokenizer(str(pair["gemma"])))
    data = make_data(s, world, anchor[1])
    if augment_only:  # m_A's settings on a development world: its training log, nothing composed
        info = train_augment(s, pair, data, out / "adapter")
        (out / "augment.json").write_text(json.dumps({"settings": asdict(s), "augment": info}, indent=1))
        return info
    t = time.perf_counter()
    data["rehearsal"] = rehearsal_rows(s, anchor) + (unknown_rows(s, anchor, world) if s.unknown_rows else [])
    data["compose"] = S.compose_rows(data, anchor[1].eos_token, s.answer_style)
    times["rehearsal_answers_s"] = time.perf_counter() - t
    preset_files.write_data(out, s, data)
    log("data", {k: len(data[k]) for k in ("facts", "questions", "rehearsal", "dev", "test")})

    t = time.perf_counter()
    augment_info = train_augment(s, pair, data, out / "adapter")
    times["augment_train_s"] = augment_info.pop("train_s", time.perf_counter() - t)
    m_a = load_augment(out / "adapter", pair["gemma"])

    if s.reuse_bridge:
        from calm_core import ComposedLM

        earlier = json.loads((Path(s.reuse_bridge) / "table.json").read_text())
        calm = ComposedLM.from_pretrained(Path(s.reuse_bridge) / "bridge", anchor=anchor, augments=[m_a])
        bridge_info = dict(earlier["bridge"], seconds=earlier["times_s"]["bridge_train_s"], reused=s.reuse_bridge)
    else:
        calm, bridge_info = train_bridge(s, anchor, m_a, data)
    times["bridge_train_s"] = bridge_info["seconds"]
    calm.save_pretrained(out / "bridge")

    if s.reuse_table:  # the reused run's own evaluation of this bridge (same settings and data): controls only
        table, general, forms = earlier["table"], earlier["general"], earlier["by_form"]
        kept = Path(s.reuse_bridge) / "predictions.json"
        preds = ({k: [r["output"] for r in v] for k, v in json.loads(kept.read_text()).items()
                  if not k.startswith(("ft/", "CALM0/"))} if kept.is_file() else {})
        for row in general_rows(general):
            table.pop(row, None)
        times["evaluate_s"] = earlier["times_s"]["evaluate_s"]
    else:
        t = time.perf_counter()
        table, preds, forms, general = evaluate_composition(s, calm, m_a, data)
        times["evaluate_s"] = time.perf_counter() - t

    def save(controls=None):
        result = {"settings": asdict(s), "table": table, "times_s": times, "general": general, "by_form": forms,
                  "augment": augment_info, "bridge": {k: v for k, v in bridge_info.items() if k != "seconds"},
                  "controls": controls or {}, "counts": {k: len(data[k]) for k in
                                                   ("questions", "rehearsal", "dev", "test", "seen")}}
        report.write(out, result, s)
        preset_files.write_preset_json(out, result, s, data)
        return result

    save()  # the table so far (CALM and the cheap controls), rewritten when the trained controls are in
    controls = {}
    unknown = set(s.controls) - {"finetune", "untrained"}
    if unknown:
        raise SystemExit(f"unknown controls {sorted(unknown)}: choose among finetune, untrained")
    if s.reuse_finetune:
        cells, controls["finetune"], seconds, ft_preds = reused_finetune(Path(s.reuse_finetune), out)
        for row, value in cells.items():
            table[row][FT] = value
        times["finetune_train_s_reused"] = seconds
        preds.update(ft_preds)
    elif "finetune" in s.controls:
        steps = s.finetune_steps or bridge_info["steps_run"]
        ft = finetune_anchor(s, load_causal_lm(str(pair["smollm2"]))[0], anchor[1], data["compose"], steps)
        times["finetune_train_s"] = ft["seconds"]
        t = time.perf_counter()
        ft_calm = as_composed(ft["model"], anchor[1])
        table[ROW_TEST][FT], preds["ft/test"] = exact(ft_calm, data["test"], s)
        table[ROW_SEEN][FT], _ = exact(ft_calm, data["seen"], s)
        times["evaluate_s"] += time.perf_counter() - t
        controls["finetune"] = {"steps": steps, "loss_last": ft["loss"][-5:]}
        del ft, ft_calm
    if "untrained" in s.controls:
        plain = load_causal_lm(str(pair["gemma"]))
        freeze(plain[0].eval())
        calm0, info0 = train_bridge(s, anchor, plain, data)
        times["bridge_untrained_train_s"] = info0["seconds"]
        t = time.perf_counter()
        table[ROW_TEST]["CALM with untrained m_A"], preds["CALM0/test"] = exact(calm0, data["test"], s)
        table[ROW_SEEN]["CALM with untrained m_A"], _ = exact(calm0, data["seen"], s)
        times["evaluate_s"] += time.perf_counter() - t
        controls["untrained"] = {k: info0[k] for k in ("checks", "best_step", "best_dev_exact", "steps_run")}
        del calm0
    table.update(general_rows(general))
    times["total_s"] = time.perf_counter() - t0
    result = save(controls)
    (out / "predictions.json").write_text(json.dumps(
        {k: [{"prompt": r.get("question", r["prompt"]), "reference": r["completion"], "output": p}
             for r, p in zip(data[k.split("/")[1]], v)] for k, v in preds.items()}, indent=1))
    log("table", json.dumps(table, indent=1))
    log("times", json.dumps(times))
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", choices=["default", "shipped", "smoke"], default="default",
                    help="shipped: the preset's recipe, frozen for fresh worlds; smoke: tiny (tests)")
    ap.add_argument("--smoke", action="store_true", help="--settings smoke")
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", nargs="*", default=[], help="Settings fields as name=json_value")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--reuse-augment", default=None)
    ap.add_argument("--reuse-bridge", default=None)
    ap.add_argument("--no-controls", action="store_true", help="skip both trained controls "
                    "(or choose: --set 'controls=[\"untrained\"]')")
    ap.add_argument("--reuse-table", action="store_true",
                    help="with --reuse-bridge: keep its evaluated rows and run the trained controls only")
    ap.add_argument("--reuse-finetune", default=None,
                    help="a run folder whose anchor + LoRA control (same composition data) is kept, not retrained")
    ap.add_argument("--augment-only", action="store_true", help="train m_A only (its log in OUT/adapter)")
    args = ap.parse_args(argv)
    s = Settings.named("smoke" if args.smoke else args.settings)
    for k, v in (item.split("=", 1) for item in args.set):
        setattr(s, k, json.loads(v))
    if args.seed is not None:
        s.seed = args.seed
    for name in ("reuse_augment", "reuse_bridge", "reuse_finetune"):
        if getattr(args, name):
            setattr(s, name, getattr(args, name))
    if args.reuse_table:
        if not args.reuse_bridge:
            raise SystemExit("--reuse-table needs --reuse-bridge (the run whose table.json it keeps)")
        s.reuse_table = True
    if args.no_controls:
        s.controls = []
    out = Path(args.out or f"runs/real_knowledge/seed{s.seed}")
    run(s, out, augment_only=args.augment_only)
