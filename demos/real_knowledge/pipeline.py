"""Knowledge through the bridge with the real pair: world -> m_A (LoRA) -> composition -> controls -> table -> preset.

    python -m demos.real_knowledge                         # dev world (seed 0), writes runs/real_knowledge/seed0
    python -m demos.real_knowledge --seed 1 --out DIR      # a fresh world, run once
    python -m demos.real_knowledge --smoke --out /tmp/rk   # the whole pipeline at a tiny size (tests)
    python -m demos.real_knowledge --reuse-augment DIR/adapter ...   # skip m_A's training

Anchor (frozen, never sees the world): SmolLM2-135M-Instruct, a chat model, asked in its own chat template.
m_A: Gemma 3 270M (base) + a LoRA adapter trained on the world's encyclopedia sentences only.
Every score is exact match on the value (the answer's first line, surrounding spaces and a final full stop
removed), greedy, batched (calm_core.evaluation.predictions).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from calm_core import CALMConfig, ComposedLM, load_causal_lm
from calm_core.data import Example
from calm_core.evaluation import as_composed, lm_loss, predictions
from calm_core.models import freeze
from calm_core.real_pair import prepared_pair
from calm_core.training import TrainConfig, Trainer

from . import augment as A
from . import world as W
from .augment import log

GENERAL = [  # the anchor's other abilities: general chat prompts with short written answers
    ("What is the capital of France?", "The capital of France is Paris."),
    ("How many days are there in a week?", "There are seven days in a week."),
    ("What colour is the sky on a clear day?", "On a clear day the sky is blue."),
    ("Name a fruit that is yellow.", "A banana is a yellow fruit."),
    ("What do bees make?", "Bees make honey."),
    ("What is two plus three?", "Two plus three is five."),
    ("Which animal is known for saying 'moo'?", "A cow says moo."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("Give me a word that rhymes with cat.", "Hat rhymes with cat."),
    ("What do plants need to grow?", "Plants need water, light and soil to grow."),
    ("Translate 'bonjour' into English.", "Bonjour means hello."),
    ("What is the largest ocean on Earth?", "The Pacific Ocean is the largest ocean on Earth."),
    ("Write a short greeting for a friend.", "Hello, my friend! I hope you are having a wonderful day."),
    ("What is water made of?", "Water is made of hydrogen and oxygen."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What season comes after winter?", "Spring comes after winter."),
]


@dataclass
class Settings:
    seed: int = 0
    entities: int = 500
    towns: int = 40
    attributes: list[str] = field(default_factory=lambda: ["town"])
    compose_fraction: float = 0.2
    dev: int = 100  # development entities (settings were chosen on them)
    eval_test: int = 200  # held-out test entities asked (one question each, the question forms in turn)
    eval_dev: int = 100
    eval_seen: int = 60  # composition entities asked again (memorised?)
    # m_A: Gemma 3 270M + LoRA on the encyclopedia
    lora_rank: int = 16
    lora_alpha: float = 32.0
    augment_lr: float = 3e-3
    augment_batch: int = 25
    augment_epochs: int = 20
    augment_minutes: float = 30.0
    target_recall: float = 98.0
    # the bridge
    every: int = 6
    anchor_layers: list[int] | None = None
    augment_layers: list[int] | None = None
    num_heads: int | None = None
    gate: str = "channel"
    window: int = 0
    null_slot: bool = False
    recency: int = 0
    compose_steps: int = 150
    compose_batch: int = 16
    compose_lr: float = 1e-3
    gate_lr_scale: float = 20.0
    augment_noise: float = 0.5
    # control: the anchor + LoRA on the composition data (same steps and batch as the bridge)
    finetune_rank: int = 16
    finetune_lr: float = 1e-3
    finetune_steps: int | None = None  # None: compose_steps
    max_new_tokens: int = 8
    general_new_tokens: int = 24
    general_prompts: int = 16
    threads: int = 2
    reuse_augment: str | None = None
    controls: bool = True

    @classmethod
    def smoke(cls) -> "Settings":
        return cls(entities=10, towns=4, dev=2, eval_test=4, eval_dev=2, eval_seen=2, augment_batch=10,
                   augment_epochs=1, target_recall=101.0, lora_rank=4, anchor_layers=[28], augment_layers=[17],
                   compose_steps=1, compose_batch=4, max_new_tokens=2, general_new_tokens=2, general_prompts=2,
                   finetune_rank=4)

    def calm_config(self) -> CALMConfig:
        return CALMConfig(every=self.every, anchor_layers=self.anchor_layers, augment_layers=self.augment_layers,
                          num_heads=self.num_heads, gate=self.gate, window=self.window, null_slot=self.null_slot,
                          recency=self.recency)


def answer(text: str) -> str:
    """The answer as scored: first line, spaces and a final full stop removed."""
    return text.strip().split("\n")[0].strip().rstrip(".").strip()


def completion_answer(text: str) -> str:
    """m_A's continuation of "X was born in": up to the first full stop, comma or line break."""
    for stop in ".,\n":
        text = text.split(stop)[0]
    return text.strip()


def chat(tok, question: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)


# ---- 1. the world and the data --------------------------------------------------------------

def make_data(s: Settings, anchor_tok) -> dict:
    world = W.make_world(s.seed, s.entities, s.towns)
    parts = W.split(world, s.compose_fraction, s.dev, s.seed)

    def ask(people, every_form: bool, limit=None):
        out = []
        for i, p in enumerate(people[:limit]):
            for a in s.attributes:
                qs = world.questions(p, a)
                for q in (qs if every_form else [qs[i % len(qs)]]):
                    out.append({"prompt": chat(anchor_tok, q), "completion": p.value(a), "question": q,
                                "entity": p.name, "attribute": a})
        return out

    facts = [[(pre.rstrip(), " " + p.value(a) + post) for pre, post in W.FACTS[a]] for p in world.people
             for a in s.attributes]
    return {
        "world": world, "parts": parts, "facts": facts,
        "compose": ask(parts["compose"], True),
        "dev": ask(parts["dev"], False, s.eval_dev),
        "test": ask(parts["test"], False, s.eval_test),
        "seen": ask(parts["compose"], False, s.eval_seen),
        "completion_test": [{"prompt": W.COMPLETION[a].format(x=p.name), "completion": p.value(a), "entity": p.name,
                             "attribute": a} for p in parts["test"][:s.eval_test] for a in s.attributes],
        "general": [{"prompt": chat(anchor_tok, q), "completion": r, "question": q} for q, r in GENERAL[:s.general_prompts]],
    }


def examples(rows) -> list[Example]:
    return [Example(r["prompt"], r["completion"]) for r in rows]


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({k: r[k] for k in r}) + "\n" for r in rows))


# ---- 2. evaluation --------------------------------------------------------------------------

def exact(calm, rows, s: Settings, extract=answer) -> tuple[float, list[str]]:
    preds = predictions(calm, examples(rows), max_new_tokens=s.max_new_tokens)
    right = [extract(p) == r["completion"] for p, r in zip(preds, rows)]
    return 100.0 * sum(right) / max(1, len(rows)), preds


def general_check(calm, rows, s: Settings) -> dict:
    ex = examples(rows)
    on = lm_loss(calm, ex)
    with calm.gate_scale(0.0):
        off = lm_loss(calm, ex)
        answers_off = predictions(calm, ex, max_new_tokens=s.general_new_tokens)
    answers_on = predictions(calm, ex, max_new_tokens=s.general_new_tokens)
    return {"perplexity_on": on["perplexity"], "perplexity_off": off["perplexity"],
            "ratio": on["perplexity"] / off["perplexity"],
            "identical_answers": sum(a == b for a, b in zip(answers_on, answers_off)), "prompts": len(rows),
            "answers": [{"question": r["question"], "bridge_on": a, "bridge_off": b}
                        for r, a, b in zip(rows, answers_on, answers_off)]}


# ---- 3. training ----------------------------------------------------------------------------

def train_bridge(s: Settings, anchor, augment, data, out: Path | None = None) -> tuple[ComposedLM, dict]:
    torch.manual_seed(s.seed)
    calm = ComposedLM(anchor, [augment], s.calm_config())
    config = TrainConfig(steps=s.compose_steps, lr=s.compose_lr, batch_size=s.compose_batch,
                         warmup_steps=min(20, max(1, s.compose_steps // 10)), gate_lr_scale=s.gate_lr_scale,
                         augment_noise=s.augment_noise, log_every=10, eval_every=max(10, s.compose_steps // 5),
                         eval_examples=64, seed=s.seed, progress=False)
    start = time.perf_counter()
    history = []
    trainer = Trainer(calm, examples(data["compose"]), examples(data["dev"]), config,
                      callback=lambda rec: _record(history, rec))
    trainer.train()
    return calm, {"seconds": time.perf_counter() - start, "history": history,
                  "bridge_parameters": calm.num_parameters()[0]}


def _record(history: list, rec: dict) -> None:
    short = {k: v for k, v in rec.items() if k != "gate_values"}
    history.append(short)
    log("bridge", json.dumps(short))


def finetune_anchor(s: Settings, model, tok, rows) -> dict:
    """The control: the anchor itself + LoRA (every linear) trained on the composition data, loss on the answer
    and the end-of-turn token, same steps and batch as the bridge."""
    wrapped = A.wrap(model, s.finetune_rank, 2.0 * s.finetune_rank, s.seed)
    params = [p for p in wrapped.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.finetune_lr)
    steps = s.finetune_steps or s.compose_steps
    rng = random.Random(s.seed)
    pairs = [(r["prompt"], r["completion"] + tok.eos_token) for r in rows]
    start, order, history = time.perf_counter(), [], []
    for step in range(steps):
        if len(order) < s.compose_batch:
            order += rng.sample(pairs, len(pairs))
        batch, order = order[:s.compose_batch], order[s.compose_batch:]
        seqs = [tok(p + c, add_special_tokens=False)["input_ids"] for p, c in batch]
        plens = [len(tok(p, add_special_tokens=False)["input_ids"]) for p, _ in batch]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), tok.pad_token_id)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, (q, n) in enumerate(zip(seqs, plens)):
            ids[i, :len(q)] = torch.tensor(q)
            mask[i, :len(q)] = 1
            labels[i, n:len(q)] = torch.tensor(q[n:])
        wrapped.train()
        lr = s.finetune_lr * min(1.0, (step + 1) / max(1, min(20, steps // 10))) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = wrapped(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append(loss.item())
        if step % 10 == 0 or step == steps - 1:
            log("finetune", step, round(loss.item(), 4))
    wrapped.eval()
    return {"model": wrapped.merge_and_unload(), "seconds": time.perf_counter() - start, "loss": history}


def load_augment(adapter_dir, gemma_dir):
    from peft import PeftModel

    model, tok = load_causal_lm(str(gemma_dir))
    model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    return freeze(model.eval()), tok


# ---- 4. the whole run -----------------------------------------------------------------------

COLUMNS = ["CALM", "anchor alone", "m_A alone (chat question)", "m_A alone (best prompt)",
           "anchor + LoRA (composition data)", "CALM with untrained m_A"]


def run(s: Settings, out: Path) -> dict:
    torch.set_num_threads(s.threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pair = prepared_pair()
    if pair is None:
        raise SystemExit("The real pair is not prepared: python -m calm_core.real_pair")
    times, t0 = {}, time.perf_counter()
    anchor = load_causal_lm(str(pair["smollm2"]))
    freeze(anchor[0].eval())
    data = make_data(s, anchor[1])
    (out / "data").mkdir(parents=True, exist_ok=True)
    (out / "world.json").write_text(json.dumps(data["world"].to_dict(), indent=1))
    (out / "data" / "encyclopedia.txt").write_text(
        "".join(f"{pre}{val}\n" for phr in data["facts"] for pre, val in phr))
    for name in ("compose", "dev", "test", "seen", "completion_test", "general"):
        write_jsonl(out / "data" / f"{name}.jsonl", data[name])
    log("data", {k: len(data[k]) for k in ("facts", "compose", "dev", "test")})

    # m_A
    adapter = out / "adapter"
    if s.reuse_augment:
        if Path(s.reuse_augment).resolve() != adapter.resolve():
            shutil.copytree(s.reuse_augment, adapter, dirs_exist_ok=True)
        log_file = adapter / "augment_log.jsonl"
        augment_info = {"reused": s.reuse_augment, "history": [json.loads(x) for x in log_file.read_text().splitlines()]
                        if log_file.is_file() else []}
    else:
        gemma, gtok = load_causal_lm(str(pair["gemma"]))
        t = time.perf_counter()
        probe = [f[0] for f in data["facts"][::max(1, len(data["facts"]) // 100)]]
        model, hist = A.train_lora(gemma, gtok, data["facts"], probe, rank=s.lora_rank, alpha=s.lora_alpha,
                                   lr=s.augment_lr, batch_size=s.augment_batch, max_epochs=s.augment_epochs,
                                   max_minutes=s.augment_minutes, target_recall=s.target_recall, seed=s.seed,
                                   save_dir=adapter, log_path=adapter / "augment_log.jsonl")
        times["augment_train_s"] = time.perf_counter() - t
        augment_info = {"history": hist}
        del model, gemma
    m_a = load_augment(adapter, pair["gemma"])

    # CALM
    calm, bridge_info = train_bridge(s, anchor, m_a, data)
    times["bridge_train_s"] = bridge_info["seconds"]
    calm.save_pretrained(out / "bridge")

    # evaluation
    t = time.perf_counter()
    table, preds = {}, {}
    row_test, row_dev, row_seen = "exact match %, held-out entities", "exact match %, dev entities", \
        "exact match %, composition entities"
    for row in (row_test, row_dev, row_seen):
        table[row] = {}
    for row, key in ((row_test, "test"), (row_dev, "dev"), (row_seen, "seen")):
        table[row]["CALM"], preds[f"CALM/{key}"] = exact(calm, data[key], s)
    with calm.gate_scale(0.0):
        table[row_test]["anchor alone"], preds["anchor/test"] = exact(calm, data["test"], s)
        table[row_seen]["anchor alone"], _ = exact(calm, data["seen"], s)
    m_a_alone = as_composed(*m_a)
    table[row_test]["m_A alone (chat question)"], preds["m_A/test"] = exact(m_a_alone, data["test"], s)
    table[row_test]["m_A alone (best prompt)"], preds["m_A best/test"] = exact(
        m_a_alone, data["completion_test"], s, completion_answer)
    general = general_check(calm, data["general"], s)
    times["evaluate_s"] = time.perf_counter() - t
    from . import report

    def save(controls={}):
        result = {"settings": asdict(s), "table": table, "times_s": times, "general": general,
                  "augment": augment_info, "bridge": {k: v for k, v in bridge_info.items() if k != "seconds"},
                  "controls": controls, "counts": {k: len(data[k]) for k in ("compose", "dev", "test", "seen")}}
        report.write(out, result, s)
        write_preset_json(out, result, s, data)
        return result

    save()  # the table so far (CALM and the cheap controls), rewritten when the trained controls are in
    controls = {}
    if s.controls:
        # the anchor fine-tuned (LoRA) on the composition data
        ft = finetune_anchor(s, load_causal_lm(str(pair["smollm2"]))[0], anchor[1], data["compose"])
        times["finetune_train_s"] = ft["seconds"]
        t = time.perf_counter()
        ft_calm = as_composed(ft["model"], anchor[1])
        table[row_test]["anchor + LoRA (composition data)"], preds["ft/test"] = exact(ft_calm, data["test"], s)
        table[row_seen]["anchor + LoRA (composition data)"], _ = exact(ft_calm, data["seen"], s)
        times["evaluate_s"] += time.perf_counter() - t
        controls["finetune_loss_last"] = ft["loss"][-5:]
        del ft, ft_calm
        # CALM with the untrained m_A
        plain = load_causal_lm(str(pair["gemma"]))
        freeze(plain[0].eval())
        calm0, info0 = train_bridge(s, anchor, plain, data)
        times["bridge_untrained_train_s"] = info0["seconds"]
        t = time.perf_counter()
        table[row_test]["CALM with untrained m_A"], preds["CALM0/test"] = exact(calm0, data["test"], s)
        table[row_seen]["CALM with untrained m_A"], _ = exact(calm0, data["seen"], s)
        times["evaluate_s"] += time.perf_counter() - t
        controls["untrained_history"] = info0["history"][-3:]
        del calm0
    table["general prompts: perplexity of written answers"] = {"CALM": general["perplexity_on"],
                                                               "anchor alone": general["perplexity_off"]}
    times["total_s"] = time.perf_counter() - t0
    result = save(controls)
    (out / "predictions.json").write_text(json.dumps(
        {k: [{"prompt": r.get("question", r["prompt"]), "reference": r["completion"], "output": p}
             for r, p in zip(data[k.split("/")[1]] if "best" not in k else data["completion_test"], v)]
         for k, v in preds.items()}, indent=1))
    log("table", json.dumps(table, indent=1))
    log("times", json.dumps(times))
    return result


def write_preset_json(out: Path, result: dict, s: Settings, data: dict) -> None:
    """preset.json: the models are the real pair's (by key), m_A's adapter and the bridge are files here."""
    row = result["table"]["exact match %, held-out entities"]
    write_jsonl(out / "data" / "composition_train.jsonl", [{"prompt": r["prompt"], "completion": r["completion"]}
                                                           for r in data["compose"]])
    write_jsonl(out / "data" / "composition_validation.jsonl", [{"prompt": r["prompt"], "completion": r["completion"]}
                                                                for r in data["dev"]])
    write_jsonl(out / "data" / "eval_heldout.jsonl", [{"prompt": r["prompt"], "completion": r["completion"]}
                                                      for r in data["test"]])
    write_jsonl(out / "data" / "eval_general.jsonl", [{"prompt": r["prompt"], "completion": r["completion"]}
                                                      for r in data["general"]])
    cells = ", ".join(f"{k} {v:.1f}" for k, v in row.items())
    meta = {
        "name": "real_knowledge",
        "title": "A made-up world that only m_A knows, used by a frozen real chat model (SmolLM2 + Gemma 3)",
        "description": (f"m_A = Gemma 3 270M + a LoRA adapter trained only on encyclopedia sentences about "
                        f"{s.entities} invented people and their home towns ({s.towns} invented towns); the anchor = "
                        f"SmolLM2-135M-Instruct, frozen, never shown the world. The bridge was trained on questions "
                        f"about {len(data['parts']['compose'])} people (20%); ask about others (world.json lists "
                        f"them). Exact match on the town, held-out people: {cells}."),
        "example_prompts": [r["question"] for r in data["test"][:4]],
        "prompt_mode": "chat",
        "anchor_model": "real_pair:smollm2",
        "augment_model": "real_pair:gemma",
        "augment_adapter": "adapter",
        "bridge": "bridge",
        "calm_config": s.calm_config().to_dict(),
        "max_new_tokens": s.max_new_tokens,
        "eval_max_new_tokens": s.max_new_tokens,
        "metrics": ["exact_match", "loss"],
        "eval_files": {"held-out people": "data/eval_heldout.jsonl", "general prompts": "data/eval_general.jsonl"},
        "eval_table_rows": {"held-out people": {"exact_match": "exact match %, held-out entities"}},
        "train_file": "data/composition_train.jsonl",
        "validation_file": "data/composition_validation.jsonl",
        "table": result["table"],
        "times_s": result["times_s"],
        "settings": result["settings"],
    }
    (out / "preset.json").write_text(json.dumps(meta, indent=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", nargs="*", default=[], help="Settings fields as name=json_value")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--reuse-augment", default=None)
    ap.add_argument("--no-controls", action="store_true")
    args = ap.parse_args(argv)
    s = Settings.smoke() if args.smoke else Settings()
    for item in args.set:
        k, v = item.split("=", 1)
        setattr(s, k, json.loads(v))
    if args.seed is not None:
        s.seed = args.seed
    if args.reuse_augment:
        s.reuse_augment = args.reuse_augment
    if args.no_controls:
        s.controls = False
    out = Path(args.out or f"runs/real_knowledge/seed{s.seed}")
    run(s, out)
