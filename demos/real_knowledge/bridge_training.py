"""Training for the table: the bridge (with early stopping on the development people) and the fine-tuned-anchor
control (LoRA on the same composition data, same steps and batch).

The bridge is checked every `check_every` steps by exact match on the development people's questions (never on
the held-out test people); the best check's bridge is kept, and training stops after `patience` checks without a
better one.
"""
from __future__ import annotations

import copy
import json
import math
import random
import time

import torch

from calm_core import ComposedLM, load_causal_lm
from calm_core.models.loading import freeze
from calm_core.training.recipes import start_on_newest_token
from calm_core.training.trainer import TrainConfig, Trainer
from calm_core.training.vocab_init import init_value_path

from . import augment as A
from .augment import log
from .not_recorded import value as not_recorded_value
from .scoring import exact, examples, trained_answer
from .world import fact_position


def train_bridge(s, anchor, augment, data) -> tuple[ComposedLM, dict]:
    """The bridge on data["compose"] (questions about 20% of the people + rehearsal prompts), whose completions
    carry their own end-of-turn tokens."""
    torch.manual_seed(s.seed)
    calm = ComposedLM(anchor, [augment], s.calm_config())
    if s.value_init:  # the value path starts as m_A's vocabulary -> the anchor's, weighted to the answers' tokens
        answers = [trained_answer(r["completion"]) for r in data["questions"]]
        if s.unknown_answer == "not_recorded":  # m_A's "an unknown town" must cross the map as exactly as a town
            answers.append(" " + not_recorded_value())
        log("value init", init_value_path(calm, answers=answers,
                                           answer_share=s.value_answer_share))
    if s.recency_init and s.answer_style == "sentence":  # the fact is the answer's own "was born in": age 0
        log("recency init", start_on_newest_token(calm, s.recency_init))  # the knowledge-sentence recipe's start
    elif s.recency_init:
        log("recency init", start_recency_at_the_fact(calm, data["questions"], s.recency_init))
    config = TrainConfig(steps=s.compose_steps, lr=s.compose_lr, batch_size=s.compose_batch,
                         warmup_steps=min(20, max(1, s.compose_steps // 10)), gate_lr_scale=s.gate_lr_scale,
                         position_lr_scale=s.position_lr_scale, value_lr_scale=s.value_lr_scale,
                         augment_noise=s.augment_noise, log_every=min(10, s.check_every), eval_every=s.check_every,
                         eval_examples=64, seed=s.seed, progress=False, append_eos=False,
                         bf16=s.compose_bf16, cache_budget_mb=s.cache_budget_mb)
    history, checks = [], []
    best = {"dev": -1.0, "step": 0, "check": 0, "state": copy.deepcopy(calm.bridge.state_dict())}
    dev_rows = data["dev"][:s.check_dev]
    trainer = None

    def on_record(rec: dict) -> None:
        history.append({k: v for k, v in rec.items() if k != "gate_values"})
        log("bridge", json.dumps(history[-1]))
        if rec["step"] % s.check_every and rec["step"] != s.compose_steps:
            return
        dev, outputs = exact(calm, dev_rows, s)
        checks.append({"step": rec["step"], "dev_exact": dev, "val_loss": rec.get("val_loss"),
                       "examples": [f"{r['completion']} -> {o!r}" for r, o in zip(dev_rows[:4], outputs)]})
        log("bridge check", json.dumps(checks[-1]))
        if dev > best["dev"]:
            best.update(dev=dev, step=rec["step"], check=len(checks) - 1, state=copy.deepcopy(calm.bridge.state_dict()))
        elif len(checks) - 1 - best["check"] >= s.patience:
            trainer.request_stop()

    start = time.perf_counter()
    val = examples([dict(r, completion=trained_answer(r["completion"], r["entity"], s.answer_style)) for r in dev_rows])
    trainer = Trainer(calm, examples(data["compose"]), val, config, callback=on_record)
    result = trainer.train()
    calm.bridge.load_state_dict(best["state"])
    return calm, {"seconds": time.perf_counter() - start, "history": history, "checks": checks,
                  "best_step": best["step"], "best_dev_exact": best["dev"], "steps_run": result.step,
                  "stop_reason": result.stop_reason, "cache": result.cache_note, "bridge_parameters": calm.num_parameters()[0]}


@torch.no_grad()
def start_recency_at_the_fact(calm, questions, value: float) -> dict:
    """Set each block's recency bias to `value` at the distances between the fact (the token ending the eliciting
    phrase, m_A's tokens) and the prompt's last token, over the composition questions: {distance: questions}."""
    tok = calm.augments[0].tokenizer
    ages: dict[int, int] = {}
    for r in questions:
        enc = tok(r["prompt"], return_offsets_mapping=True)
        try:
            fact = fact_position(r["prompt"], [tuple(o) for o in enc["offset_mapping"]])
        except ValueError:  # a drawn question without an eliciting phrase (phrasings.py): no distance to start at
            continue
        age = len(enc["input_ids"]) - 1 - fact
        ages[age] = ages.get(age, 0) + 1
    return start_recency_at(calm, ages, value)


@torch.no_grad()
def start_recency_at(calm, ages: dict[int, int], value: float) -> dict:
    """Every block's recency bias set to `value` at the given ages (m_A tokens before the newest)."""
    for block in calm.bridge.augments[0].blocks:
        if block.recency is not None:
            for age in ages:
                if age < block.recency.shape[1]:
                    block.recency[:, age] = value
    return dict(sorted(ages.items()))


def finetune_anchor(s, model, tok, rows, steps: int) -> dict:
    """The control: the anchor itself + LoRA (every linear) trained on the composition data, loss on the answer
    and the end-of-turn token, same steps and batch as the bridge was given."""
    wrapped = A.wrap(model, s.finetune_rank, 2.0 * s.finetune_rank, s.seed)
    params = [p for p in wrapped.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.finetune_lr)
    rng = random.Random(s.seed)
    pairs = [(r["prompt"], r["completion"]) for r in rows]  # end-of-turn tokens included where they belong
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
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=s.compose_bf16):  # as the bridge's steps
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
    """m_A as shipped: Gemma 3 270M with the world's LoRA adapter merged, frozen."""
    from peft import PeftModel

    model, tok = load_causal_lm(str(gemma_dir))
    model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    return freeze(model.eval()), tok
