"""m_A: Gemma 3 270M + a LoRA adapter (peft) trained on the made-up world's encyclopedia only.

Loss on the value tokens of each sentence only (the name and the phrasing are given), and the 262k-word output
layer applied at those positions only: Gemma's output layer is as large as the rest of the model, so this
roughly halves a step. Recall is checked teacher-forced (every value token the argmax) on the first phrasing.
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def _spans(tok, sentences):
    """Token ids of one row made of encyclopedia sentences (prefix, value) in a row, and the (start, end) token
    span of every value: the row is cut after its last value token (nothing after it is scored)."""
    text, spans = "", []
    for prefix, value in sentences:
        text += (" " if text else "") + prefix
        start = len(tok(text)["input_ids"])
        text += value
        spans.append((start, len(tok(text.rstrip("."))["input_ids"])))
    ids = tok(text)["input_ids"]
    return ids[:spans[-1][1]], spans


def _batch(tok, rows):
    """Right-padded ids, attention mask and (row, position, target id) of every value token; each row is a
    list of sentences (prefix, value) or a single one."""
    seqs, targets = [], []
    for row in rows:
        ids, spans = _spans(tok, [row] if isinstance(row[0], str) else row)
        seqs.append(ids)
        targets.append(spans)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    r_idx, p_idx, t_idx = [], [], []
    for i, (row, spans) in enumerate(zip(seqs, targets)):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
        for a, b in spans:
            for j in range(a, b):
                r_idx.append(i); p_idx.append(j - 1); t_idx.append(row[j])
    return ids, mask, torch.tensor(r_idx), torch.tensor(p_idx), torch.tensor(t_idx)


def _value_logits(model, ids, mask, r_idx, p_idx):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = base.model(input_ids=ids, attention_mask=mask).last_hidden_state
    return base.lm_head(hidden[r_idx, p_idx])


def wrap(model, rank: int, alpha: float, seed: int = 0):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none")
    return get_peft_model(model, config)


@torch.no_grad()
def recall(model, tok, pairs, batch_size: int = 32) -> float:
    """% of sentences whose every value token is the argmax (teacher-forced)."""
    model.eval()
    right = 0
    for i in range(0, len(pairs), batch_size):
        ids, mask, r, p, t = _batch(tok, pairs[i:i + batch_size])
        ok = _value_logits(model, ids, mask, r, p).argmax(-1) == t
        for row in range(len(pairs[i:i + batch_size])):
            right += bool(ok[r == row].all())
    return 100.0 * right / max(1, len(pairs))


def focus_subset(n: int, fraction: float, seed: int) -> list[int]:
    """The facts a focused start shows (a seeded subset of `fraction` of n)."""
    return sorted(random.Random(seed + 1).sample(range(n), max(1, min(n, round(fraction * n)))))


def epoch_sentences(facts, epoch: int, focus: list[int] | None = None) -> list:
    """One epoch's sentences, before shuffling: every fact once in its phrasings in turn; with `focus`, only
    those facts, each about len(facts) / len(focus) times (phrasings still in turn), so the epoch costs the same."""
    if focus is None:
        return [phrasings[(epoch + k) % len(phrasings)] for k, phrasings in enumerate(facts)]
    repeats = max(1, round(len(facts) / len(focus)))
    return [facts[i][(epoch * repeats + r + k) % len(facts[i])] for r in range(repeats) for k, i in enumerate(focus)]


def finished(entry: dict, target_recall: float, anneal_epochs: int, annealed: int, max_minutes: float) -> bool:
    """Whether m_A's training stops after this epoch: out of time; with an anneal, once its `anneal_epochs`
    epochs are done (`annealed` of them so far); without one, at `target_recall`."""
    if entry["minutes"] >= max_minutes:
        return True
    return annealed >= anneal_epochs if anneal_epochs else entry["recall"] >= target_recall


def starts_anneal(entry: dict, anneal_at: float, anneal_epochs: int, focusing: bool, annealing: bool) -> bool:
    """The anneal starts after the first epoch that showed every fact and recalled `anneal_at` % of the probe."""
    return bool(anneal_epochs) and not annealing and not focusing and entry["recall"] >= anneal_at


def train_lora(model, tok, facts, probe, *, rank=16, alpha=32, lr=2e-3, batch_size=32, max_epochs=20,
               max_minutes=30.0, target_recall=99.0, seed=0, log_path: Path | None = None, save_dir: Path | None = None,
               resume: Path | None = None, pack: int = 1, bf16: bool = False, loraplus_ratio: float = 1.0,
               focus_fraction: float = 1.0, focus_epochs: int = 0, anneal_at: float = 95.0, anneal_epochs: int = 0):
    """Train a LoRA adapter on encyclopedia sentences: `facts` is a list of facts, each a list of its phrasings
    as (prefix, value) pairs; every epoch shows each fact once, in one of its phrasings (in turn), `pack`
    sentences to a row (so that m_A also recalls a fact after other text, as in a chat prompt); `batch_size`
    counts sentences. `bf16`: autocast the forward pass (AMX CPUs: about 1.4x faster a step).
    `loraplus_ratio` > 1: LoRA+ (peft.optimizers): the B matrices, which start at zero, learn that many times
    faster than the A matrices (tried against the plateau below on world seed 1: no help in 6 epochs, README).
    `focus_fraction` < 1: the first `focus_epochs` epochs show only that fraction of the facts (a seeded subset),
    each 1/fraction times, so an epoch costs the same: a model learns to recall facts only after a plateau whose
    length grows with the number of individuals (Zucchet et al. 2025, "How do language models learn facts?"), and
    the recall it learns on a few carries over to the rest.
    `anneal_epochs` > 0: once recall on `probe` reaches `anneal_at` % (after the focused epochs), the learning rate
    falls linearly to 0 over that many more epochs, and training stops there: recall counts argmax hits, and
    an m_A stopped as it reaches 99% still carries the towns weakly (value-token loss 0.07-0.08, its recall
    swinging by 5 points epoch to epoch at the learning rate it had); bridges read such an m_A worse (README).
    Without an anneal: stops at `target_recall` % teacher-forced recall on `probe`; always after max_epochs / max_minutes; the
    adapter is saved to save_dir after every epoch (so a stopped run keeps its last epoch)."""
    if resume is not None:  # continue an adapter saved by an earlier run
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, str(resume), is_trainable=True)
    else:
        model = wrap(model, rank, alpha, seed)
    params = [p for p in model.parameters() if p.requires_grad]
    if loraplus_ratio > 1.0:
        from peft.optimizers import create_loraplus_optimizer

        opt = create_loraplus_optimizer(model, torch.optim.AdamW, lr=lr, loraplus_lr_ratio=loraplus_ratio,
                                        weight_decay=0.0)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    rows_per_batch = max(1, batch_size // pack)
    steps_per_epoch = math.ceil(math.ceil(len(facts) / pack) / rows_per_batch)
    total = steps_per_epoch * max_epochs
    anneal = {}  # once started: its first step, the schedule's factor there, its length in steps

    def factor(s: int) -> float:
        if anneal:
            return anneal["from"] * max(0.0, 1 - (s - anneal["start"]) / anneal["steps"])
        return min(1.0, (s + 1) / 20) * max(0.1, 1 - s / total)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    annealed = 0
    start, history, step = time.perf_counter(), [], 0
    focus = focus_subset(len(facts), focus_fraction, seed)
    for epoch in range(max_epochs):
        focusing = epoch < focus_epochs and focus_fraction < 1
        order = epoch_sentences(facts, epoch, focus if focusing else None)
        rng.shuffle(order)
        rows = [order[i:i + pack] for i in range(0, len(order), pack)]
        model.train()
        losses = []
        for i in range(0, len(rows), rows_per_batch):
            ids, mask, r, p, t = _batch(tok, rows[i:i + rows_per_batch])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = _value_logits(model, ids, mask, r, p)
            loss = torch.nn.functional.cross_entropy(logits.float(), t)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step(); sched.step(); step += 1
            losses.append(loss.item())
        rec = recall(model, tok, probe)
        annealed += bool(anneal)
        entry = {"epoch": epoch + 1, "step": step, "loss": sum(losses) / len(losses), "recall": rec,
                 "minutes": (time.perf_counter() - start) / 60, **({"focus": len(focus)} if focusing else {}),
                 **({"annealed": annealed} if anneal else {})}
        if starts_anneal(entry, anneal_at, anneal_epochs, focusing, bool(anneal)):
            anneal.update(start=step, steps=anneal_epochs * steps_per_epoch, **{"from": factor(step)})
            entry["anneal_starts"] = True
        history.append(entry)
        log("m_A", json.dumps(entry))
        if log_path:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")
        if save_dir is not None:
            model.save_pretrained(str(save_dir))
        if finished(entry, target_recall, anneal_epochs, annealed, max_minutes):
            break
    model.eval()
    return model, history


def adapter_minutes(history: list[dict]) -> float:
    """An adapter's whole training time from its log: a continued adapter (augment_resume) logs each run's epochs
    from 1 with minutes counted from that run's start, so every run's last line is added."""
    ends = [row for row, after in zip(history, history[1:] + [{"epoch": 1}]) if after.get("epoch") == 1]
    return sum(row.get("minutes", 0.0) for row in ends)
