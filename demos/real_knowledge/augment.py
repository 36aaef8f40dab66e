"""m_A: Gemma 3 270M + a LoRA adapter (peft) trained on the made-up world's encyclopedia only.

Loss on the value tokens of each sentence only (the name and the phrasing are given), and the 262k-word output
layer applied at those positions only: Gemma's output layer is as large as the rest of the model, so this
roughly halves a step. Recall is checked teacher-forced (every value token the argmax) on the first phrasing.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def _batch(tok, pairs):
    """Right-padded ids, attention mask and (row, position, target id) of every value token."""
    rows, targets = [], []
    for prefix, value in pairs:
        pre = tok(prefix)["input_ids"]
        full = tok(prefix + value.rstrip("."))["input_ids"]
        rows.append(tok(prefix + value)["input_ids"])
        targets.append((len(pre), len(full)))  # value tokens are full[len(pre):len(full)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    r_idx, p_idx, t_idx = [], [], []
    for i, (row, (a, b)) in enumerate(zip(rows, targets)):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
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


def train_lora(model, tok, facts, probe, *, rank=16, alpha=32, lr=2e-3, batch_size=32, max_epochs=20,
               max_minutes=30.0, target_recall=99.0, seed=0, log_path: Path | None = None, save_dir: Path | None = None,
               resume: Path | None = None):
    """Train a LoRA adapter on encyclopedia sentences: `facts` is a list of facts, each a list of its phrasings
    as (prefix, value) pairs; every epoch shows each fact once, in one of its phrasings (in turn).
    Stops at `target_recall` % teacher-forced recall on `probe`, or after max_epochs / max_minutes; the
    adapter is saved to save_dir after every epoch (so a stopped run keeps its last epoch)."""
    if resume is not None:  # continue an adapter saved by an earlier run
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, str(resume), is_trainable=True)
    else:
        model = wrap(model, rank, alpha, seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    steps_per_epoch = (len(facts) + batch_size - 1) // batch_size
    total = steps_per_epoch * max_epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / total))
    start, history, step = time.perf_counter(), [], 0
    for epoch in range(max_epochs):
        order = [phrasings[(epoch + k) % len(phrasings)] for k, phrasings in enumerate(facts)]
        rng.shuffle(order)
        model.train()
        losses = []
        for i in range(0, len(order), batch_size):
            ids, mask, r, p, t = _batch(tok, order[i:i + batch_size])
            loss = torch.nn.functional.cross_entropy(_value_logits(model, ids, mask, r, p), t)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step(); sched.step(); step += 1
            losses.append(loss.item())
        rec = recall(model, tok, probe)
        entry = {"epoch": epoch + 1, "step": step, "loss": sum(losses) / len(losses), "recall": rec,
                 "minutes": (time.perf_counter() - start) / 60}
        history.append(entry)
        log("m_A", json.dumps(entry))
        if log_path:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")
        if save_dir is not None:
            model.save_pretrained(str(save_dir))
        if rec >= target_recall or entry["minutes"] >= max_minutes:
            break
    model.eval()
    return model, history
