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
removed), greedy, batched (calm_core.evaluation.predictions).
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from calm_core import CALMConfig, load_causal_lm
from calm_core.evaluation import as_composed, predictions
from calm_core.model_cache import fast_bf16
from calm_core.models import freeze
from calm_core.real_pair import prepared_pair

from . import augment as A
from . import general as G
from . import world as W
from .augment import log
from .bridge_training import finetune_anchor, load_augment, train_bridge
from .reuse import reused_finetune
from .scoring import (COLUMNS, FT, ROW_DEV, ROW_SEEN, ROW_TEST, answer, chat, examples, exact,  # noqa: F401 (COLUMNS)
                      general_check, general_rows, starts_with_answer, trained_answer)


@dataclass
class Settings:
    seed: int = 0
    entities: int = 1000  # 500 left 100 composition people, 2-3 per town: the bridge memorised them
    towns: int = 40
    # towns that both tokenizers cut alike (" Stok|air|un" in both); without it, SmolLM2 and Gemma split a third
    # of the towns differently, and the bridge got first tokens right but spelled the rest wrong (README)
    same_split: bool = True
    attributes: list[str] = field(default_factory=lambda: ["town"])
    compose_fraction: float = 0.2
    dev: int = 100  # development entities: early stopping and every setting were chosen on them
    eval_test: int = 300  # held-out test entities asked (one question each, the question forms in turn)
    eval_dev: int = 100
    eval_seen: int = 100  # composition entities asked again (memorised?)
    # m_A: Gemma 3 270M + LoRA on the encyclopedia
    lora_rank: int = 32
    lora_alpha: float = 32.0
    augment_lr: float = 1e-3
    augment_batch: int = 16  # sentences per step
    augment_pack: int = 2  # sentences per row, so that a fact is also recalled after other text
    augment_bf16: bool | None = None  # autocast m_A's steps; None: where the processor has native bf16
    augment_epochs: int = 60
    augment_loraplus: float = 1.0  # LoRA+ ratio of the B matrices' learning rate to the A matrices' (1: plain LoRA)
    # a focused start: the first augment_focus_epochs show only this fraction of the facts, 5x each (augment.py):
    # it ends m_A's plateau (world 1: 91% recall at epoch 8 where plain sat at 0-6% for 15). Without the anneal
    # below, its m_A was harder for the bridge to read (world 0: CALM 52.7% vs 78.7% plain, seventh session);
    # with it, world 4's bridge reached 98% on the development people where plain m_A's reached 80% (README)
    augment_focus: float = 0.2
    augment_focus_epochs: int = 4
    augment_minutes: float = 30.0
    target_recall: float = 99.0
    # once recall reaches augment_anneal_at %, the learning rate falls to 0 over augment_anneal_epochs epochs and
    # m_A stops there (0: stop at target_recall, as before the eleventh session). Stopped at 99% recall, m_A's
    # value-token loss sat at 0.07-0.08 on every world but seed 0; annealed, world 4's fell to 0.005 (README)
    augment_anneal_at: float = 95.0
    augment_anneal_epochs: int = 4
    # rehearsal: general prompts with the anchor's own answers, trained on beside the questions
    rehearsal: int = 100
    rehearsal_new_tokens: int = 40
    # train the rehearsal answers toward the anchor's whole next-token distribution (KL), not its greedy tokens:
    # general-prompt perplexity ratio 1.11 with it, 1.90 without (development runs, README)
    rehearsal_kl: bool = True
    # the bridge
    every: int = 6
    anchor_layers: list[int] | None = field(default_factory=lambda: [20, 23, 26, 29])
    # 18 = Gemma's final hidden state (after its final norm): its inner layers carry channels 100x the rest
    augment_layers: list[int] | None = field(default_factory=lambda: [18, 18, 18, 18])
    num_heads: int | None = None
    gate: str = "channel"
    insert: str = "after"
    window: int = 0
    null_slot: bool = True
    recency: int = 32  # the fact's phrase sits 15-18 m_A tokens before the answer
    # > 0: every head's recency bias starts at this value at the distances (in m_A tokens) between the composition
    # questions' fact and the prompt's end, so attention starts at the fact rather than having to find it. Chosen on
    # world 6 after its run once (development checks 72, 90% at 120, 240 against 3, 60%): no fresh world yet (README)
    recency_init: float = 4.0
    relative: bool = True
    value_init: bool = True  # calm_core.vocab_init: the value path starts as a map between the output vocabularies
    # the answer tokens' share of that map's fit: at 0.18 (weight 100, the sixth and seventh sessions' runs) the map
    # ranked the right town first for 84% of m_A's states at the fact (m_A itself: 99.7%), at 0.7 for 99.7% (README)
    value_answer_share: float = 0.7
    # 360, not the 600 of worlds 0-5: on the development world 4 (annealed m_A) the checks read 50, 95, 98% at steps
    # 120, 240, 360, and 600 steps took 22 min on 2 AVX2 cores, past the 15-minute budget (README, twelfth session)
    compose_steps: int = 360
    compose_batch: int = 16
    compose_lr: float = 2e-3
    # autocast the bridge's (and the LoRA control's) training steps: about 1.4x faster on an AMX CPU, 5x slower
    # on one without native bf16; None: calm_core.model_cache.fast_bf16 decides (the run records which)
    compose_bf16: bool | None = None
    gate_lr_scale: float = 5.0
    position_lr_scale: float = 25.0  # recency biases and null keys: must reach several units to pick a position
    # the value path (projection, value, output maps): 0 keeps value_init's map between the vocabularies, so the
    # bridge can only choose where to read m_A's next-token prediction, not memorise towns (dev 77% vs 72%)
    value_lr_scale: float = 0.0
    augment_noise: float = 0.05
    check_every: int = 120  # steps between checks on the development people (early stopping)
    # the frozen states of all 696 rows and the KL rows' reference log-probabilities (0.75 GB in float32): with
    # TrainConfig's 1 GB they do not all fit without bf16, and every step runs both frozen models again (4.2 s)
    cache_budget_mb: float = 3072.0
    check_dev: int = 60
    patience: int = 4
    # control: the anchor + LoRA on the composition data (same steps and batch as the bridge)
    finetune_rank: int = 16
    finetune_lr: float = 1e-3
    finetune_steps: int | None = None  # None: the steps the bridge ran
    max_new_tokens: int = 8
    general_new_tokens: int = 24
    general_prompts: int = 16
    threads: int = 2
    reuse_augment: str | None = None
    reuse_bridge: str | None = None  # a run folder whose bridge/ and table.json (training record) are reused
    reuse_table: bool = False  # with reuse_bridge: take CALM's and the cheap controls' rows from its table.json
    controls: list[str] = field(default_factory=lambda: ["finetune", "untrained"])  # the trained controls to run
    # a run folder whose anchor + LoRA control was trained on this very composition data (checked byte for byte):
    # its column is kept instead of training the control again (it depends on neither m_A nor the bridge)
    reuse_finetune: str | None = None

    @classmethod
    def smoke(cls) -> "Settings":
        return cls(entities=10, towns=4, dev=2, eval_test=4, eval_dev=2, eval_seen=2, augment_batch=10,
                   augment_epochs=1, target_recall=101.0, lora_rank=4, anchor_layers=[28], augment_layers=[18],
                   rehearsal=2, rehearsal_new_tokens=4, compose_steps=2, check_every=1, check_dev=2, compose_batch=4,
                   max_new_tokens=2, general_new_tokens=2, general_prompts=2, finetune_rank=4)

    def calm_config(self) -> CALMConfig:
        return CALMConfig(every=self.every, anchor_layers=self.anchor_layers, augment_layers=self.augment_layers,
                          num_heads=self.num_heads, gate=self.gate, insert=self.insert, window=self.window, null_slot=self.null_slot,
                          recency=self.recency, relative=self.relative)


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

    return {
        "world": world, "parts": parts, "facts": world.fact_phrasings(s.attributes),
        "questions": ask(parts["compose"], True),
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
    tok = anchor[1]
    questions = G.rehearsal(s.rehearsal, s.seed)
    rows = [{"prompt": chat(tok, q), "completion": "", "question": q} for q in questions]
    answers = predictions(as_composed(*anchor), examples(rows), max_new_tokens=s.rehearsal_new_tokens)
    for r, a in zip(rows, answers):
        ended = len(tok(a, add_special_tokens=False)["input_ids"]) < s.rehearsal_new_tokens
        r["completion"] = a + (tok.eos_token if ended else "")
        r["keep_anchor"] = s.rehearsal_kl
    return [r for r in rows if r["completion"].strip()]


def compose_rows(data: dict, eos: str) -> list[dict]:
    """The composition data: every question about the composition people (space + answer + end of turn) and the
    rehearsal rows (end of turn only where the anchor ended)."""
    return [dict(r, completion=trained_answer(r["completion"]) + eos) for r in data["questions"]] + data["rehearsal"]


# ---- 2. the whole run -----------------------------------------------------------------------


def train_augment(s: Settings, pair, data, adapter: Path) -> dict:
    """m_A's adapter in `adapter` (trained, or copied from --reuse-augment) and its training log."""
    if s.reuse_augment:
        if Path(s.reuse_augment).resolve() != adapter.resolve():
            shutil.copytree(s.reuse_augment, adapter, dirs_exist_ok=True)
        log_file = adapter / "augment_log.jsonl"
        hist = [json.loads(x) for x in log_file.read_text().splitlines()] if log_file.is_file() else []
        info = {"reused": s.reuse_augment, "history": hist}
        if hist and "minutes" in hist[-1]:  # the adapter's own training time, not the copy's
            info["train_s"] = 60.0 * hist[-1]["minutes"]
        return info
    gemma, gtok = load_causal_lm(str(pair["gemma"]))
    probe = [f[0] for f in data["facts"][::max(1, len(data["facts"]) // 100)]]
    _, hist = A.train_lora(gemma, gtok, data["facts"], probe, rank=s.lora_rank, alpha=s.lora_alpha, lr=s.augment_lr,
                           batch_size=s.augment_batch, max_epochs=s.augment_epochs, max_minutes=s.augment_minutes,
                           target_recall=s.target_recall, seed=s.seed, save_dir=adapter, pack=s.augment_pack,
                           bf16=s.augment_bf16, log_path=adapter / "augment_log.jsonl",
                           loraplus_ratio=s.augment_loraplus, focus_fraction=s.augment_focus,
                           focus_epochs=s.augment_focus_epochs, anneal_at=s.augment_anneal_at,
                           anneal_epochs=s.augment_anneal_epochs)
    return {"history": hist}


def by_form(rows, preds, extract) -> dict[str, float]:
    """Exact match % per question form (the questions' templates, in world.QUESTIONS order)."""
    out = {}
    for form in sorted({r["form"] for r in rows}):
        pairs = [(extract(p) == r["completion"]) for r, p in zip(rows, preds) if r["form"] == form]
        out[W.QUESTIONS[rows[0]["attribute"]][form]] = 100.0 * sum(pairs) / len(pairs)
    return out


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
    forms = {"CALM": by_form(data["test"], preds["CALM/test"], answer)}
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
        raise SystemExit("The real pair is not prepared: python -m calm_core.real_pair")
    if s.reuse_table and not s.reuse_bridge:
        raise SystemExit("reuse_table needs reuse_bridge (the run whose table.json it keeps)")
    times, t0 = {}, time.perf_counter()
    anchor = load_causal_lm(str(pair["smollm2"]))
    freeze(anchor[0].eval())
    from transformers import AutoTokenizer

    world = make_world(s, anchor[1], AutoTokenizer.from_pretrained(str(pair["gemma"])))
    data = make_data(s, world, anchor[1])
    if augment_only:  # m_A's settings on a development world: its training log, nothing composed
        info = train_augment(s, pair, data, out / "adapter")
        (out / "augment.json").write_text(json.dumps({"settings": asdict(s), "augment": info}, indent=1))
        return info
    t = time.perf_counter()
    data["rehearsal"] = rehearsal_rows(s, anchor)
    data["compose"] = compose_rows(data, anchor[1].eos_token)
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

    def save(controls={}):
        result = {"settings": asdict(s), "table": table, "times_s": times, "general": general, "by_form": forms,
                  "augment": augment_info, "bridge": {k: v for k, v in bridge_info.items() if k != "seconds"},
                  "controls": controls, "counts": {k: len(data[k]) for k in
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
    ap.add_argument("--smoke", action="store_true")
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
    s = Settings.smoke() if args.smoke else Settings()
    for item in args.set:
        k, v = item.split("=", 1)
        setattr(s, k, json.loads(v))
    if args.seed is not None:
        s.seed = args.seed
    if args.reuse_augment:
        s.reuse_augment = args.reuse_augment
    if args.reuse_bridge:
        s.reuse_bridge = args.reuse_bridge
    if args.reuse_table:
        if not args.reuse_bridge:
            raise SystemExit("--reuse-table needs --reuse-bridge (the run whose table.json it keeps)")
        s.reuse_table = True
    if args.no_controls:
        s.controls = []
    if args.reuse_finetune:
        s.reuse_finetune = args.reuse_finetune
    out = Path(args.out or f"runs/real_knowledge/seed{s.seed}")
    run(s, out, augment_only=args.augment_only)
