"""Every switch of the key-value pipeline, and the named sets of them (issue 18).

`Settings()` is the shipped preset (ours: base models built for the bridge). `for_run(protocol=, ablation=)`
gives the paper's protocol (plain base models, composition on KV-SUBS, KV-MATH scored on the number alone)
or the preset with one ingredient removed, so that each is one command and its table.json records which it
was. `BASE_FIELDS` says which settings shape each base model: a run may copy a base model from another run
(`base_from`) only where none of them differ, so an ablation retrains exactly what it changes.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field


@dataclass
class Settings:
    keys: int = 500
    operands: int = 2
    seed: int = 0  # the key table, its split, the expressions, every model's initialisation: a new seed is fresh data
    train_share: float = 0.2
    protocol: str = "ours"  # "ours" or "paper": which protocol the table says it measured (set by for_run)
    ablation: str = ""  # which ingredient of the preset this run removes (ABLATIONS; set by for_run)
    # base models (from scratch), trained side by side in two processes of threads/2 threads each
    augment_layers: int = 4
    anchor_layers: int = 4
    width: int = 128
    augment_steps: int = 1500
    anchor_steps: int = 1500
    augment_batch: int = 128
    anchor_batch: int = 256
    base_lr: float = 3e-3
    digit_embeddings: bool = True  # both base models' number embeddings are sums of per-digit vectors (base.DigitEmbeddings)
    augment_lookups: float = 0.3  # share of m_A's examples that are single lookups "ab=" -> "95" (the rest KV-SUBS)
    kv_subs_end: str = "="  # what ends a KV-SUBS prompt ("ab+xyz=" -> "95+22"); the paper protocol uses ";"
    augment_value_layers: list[int] = field(default_factory=lambda: [2, 3])  # where m_A's value heads read
    augment_at_last_letter: bool = True  # m_A's value heads also read at each key's last letter
    augment_value_regression: bool = True  # m_A's value heads fit one-hot digit codes by squared error
    anchor_value_layers: list[int] = field(default_factory=list)  # where m_B's value heads read
    anchor_labels: float = 0.2  # share of m_B's operands preceded by a random word (never a key)
    anchor_merged: float = 0.3  # share of m_B's operands given as a random word carrying the value (base.MERGED)
    anchor_operand_noise: float = 0.3  # Gaussian noise on m_B's operand embeddings, relative to their size
    anchor_restate: bool = True  # m_B answers expressions with word operands as "95+22=117" (recipes.anchor_sampler)
    # share of those given "95+22=" with other values in the words: m_B computes from what it wrote (finding 16)
    anchor_given: float = 0.5
    # m_B must compute before it is composed: below this NUM-MATH exact match (in [0, 1]; 0 = off) on a probe of
    # its own (fresh random expressions, never an evaluation row) it trains on, anchor_steps more with a restarted
    # schedule, at most anchor_extra_rounds times (seed 1 of the fresh tables: m_B 7.3% after 1500 steps)
    anchor_min_num_math: float = 0.7
    anchor_extra_rounds: int = 2
    parallel_base: bool = True
    # composition (the bridge)
    # into the anchor's token embeddings (layer 0, "before"), where m_B reads a word's value, from m_A's
    # last layer, each token reading only the m_A state aligned with it (README, finding 14)
    compose_anchor_layers: list[int] = field(default_factory=lambda: [0])
    compose_augment_layers: list[int] = field(default_factory=lambda: [3])
    compose_every: int = 0  # > 0: the paper's layout, m_A layers every, 2*every, ... (CALMConfig.every), not the lists
    gate: str = "channel"
    compose_insert: str = "before"
    compose_recency: int = 0  # learned attention biases for the newest m_A states (CALMConfig.recency)
    compose_null_slot: bool = True  # a null key the bridge may attend to, to write nothing (CALMConfig.null_slot)
    compose_window: int = 1  # how many of the newest m_A states each anchor token sees (CALMConfig.window; 0: all)
    compose_steps: int = 3000
    compose_batch: int = 32
    compose_lr: float = 5e-3
    compose_noise: float = 0.5  # Gaussian noise on m_A states while the bridge trains (TrainConfig.augment_noise)
    gate_lr_scale: float = 1.0  # the gates' learning rate is compose_lr x this (TrainConfig.gate_lr_scale)
    # what the bridge trains on over the training keys: "kv_math" (answered as m_B answers, + NUM-MATH) or
    # "kv_subs" (the paper's D_C: substitution only, no arithmetic)
    composition: str = "kv_math"
    compose_examples: int = 3000  # expressions over the training keys
    num_math_share: float = 0.2  # NUM-MATH mixed into the composition data (keeps m_B's arithmetic)
    # control: the anchor fine-tuned directly on the composition data
    finetune_steps: int = 600
    finetune_lr: float = 1e-3
    # evaluation
    eval_examples: int = 300
    whole_answers: bool = False  # score the whole answer (the paper: KV-MATH is the number alone), not its parts
    threads: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))
    reuse_base: bool = False  # keep the base models already in --out, whatever they were trained with
    base_from: str = ""  # a run folder to copy a base model from when no setting that shapes it differs

    @classmethod
    def smoke(cls) -> "Settings":
        """Every stage and option at a tiny scale."""
        return cls(keys=30, augment_layers=2, anchor_layers=2, width=32, augment_steps=20, anchor_steps=20,
                   augment_batch=16, anchor_batch=16, augment_value_layers=[1], augment_value_regression=True,
                   anchor_value_layers=[1], compose_anchor_layers=[1], compose_augment_layers=[1], compose_recency=2,
                   compose_steps=10, compose_batch=8, compose_examples=60, finetune_steps=10, eval_examples=12,
                   anchor_extra_rounds=1)


# The paper's protocol (section 4.1) within this demo: m_A trained on KV-SUBS only, m_B on NUM-MATH only, with
# nothing built for the bridge; composition on KV-SUBS over the training keys (no arithmetic); KV-MATH over
# held-out keys scored on the whole answer; the bridge after every second layer of m_A and m_B, seeing every
# m_A state. Kept from ours: the tokenizer, the channel gate (starts closed), the step counts and learning rates.
# KV-SUBS prompts end with ";": with "=" they would be the KV-MATH prompts, and composing on them would teach
# the composed model to answer a KV-MATH prompt with the substitution (`--kv-subs-end =` for that variant).
PAPER = dict(protocol="paper", digit_embeddings=False, augment_lookups=0.0, kv_subs_end=";",
             augment_value_layers=[], augment_at_last_letter=False, anchor_value_layers=[],
             anchor_labels=0.0, anchor_merged=0.0, anchor_given=0.0, anchor_restate=False, anchor_operand_noise=0.0,
             compose_every=2, compose_insert="after", compose_window=0, compose_null_slot=False, compose_recency=0,
             compose_noise=0.0, composition="kv_subs", num_math_share=0.0, whole_answers=True)

# One ingredient of the preset removed each (issue 18, item 3): name -> (what it removes, the settings).
ABLATIONS = {
    "value-heads": ("no value heads: m_A trained on its formats alone, no read-out of each key's value",
                    dict(augment_value_layers=[], anchor_value_layers=[])),
    "digit-embeddings": ("no digit embeddings: free number embeddings in both base models",
                         dict(digit_embeddings=False)),
    "merged-slot": ("no merged-word slot: m_B never sees a word carrying an injected value (nor the given "
                    "restatements that go with it); labelled operands and restating stay",
                    dict(anchor_merged=0.0, anchor_given=0.0)),
    "window": ("window=1 removed: each anchor token's bridge sees every m_A state so far", dict(compose_window=0)),
}


def for_run(smoke: bool = False, protocol: str = "ours", ablation: str = "") -> Settings:
    """The settings of a named run: the preset (or its smoke scale), the paper's protocol, or an ablation."""
    s = Settings.smoke() if smoke else Settings()
    if protocol not in ("ours", "paper"):
        raise SystemExit(f"--protocol is 'ours' or 'paper', not {protocol!r}")
    if ablation and (ablation not in ABLATIONS or protocol != "ours"):
        raise SystemExit(f"--ablation is one of {sorted(ABLATIONS)}, of our protocol only; got {ablation!r}")
    if protocol == "paper":
        s = dataclasses.replace(s, **PAPER)
    if ablation:
        s = dataclasses.replace(s, ablation=ablation, **ABLATIONS[ablation][1])
    return s


# The settings that decide what a base model is (the key table: keys and seed).
_SHARED = ("keys", "operands", "seed", "width", "base_lr", "digit_embeddings")
BASE_FIELDS = {
    "augment": _SHARED + ("augment_layers", "augment_steps", "augment_batch", "augment_lookups", "kv_subs_end",
                          "augment_value_layers", "augment_at_last_letter", "augment_value_regression"),
    "anchor": _SHARED + ("anchor_layers", "anchor_steps", "anchor_batch", "anchor_value_layers", "anchor_labels",
                         "anchor_merged", "anchor_operand_noise", "anchor_restate", "anchor_given",
                         "anchor_min_num_math", "anchor_extra_rounds"),
}


def base_differences(name: str, trained_with: dict, s: Settings) -> list[str]:
    """The settings that shape base model `name` ("augment" or "anchor") and differ between `trained_with`
    (a recorded asdict(Settings); a field it lacks had its default, or its ADDED_LATER value) and s."""
    defaults = {**dataclasses.asdict(Settings()), **ADDED_LATER}
    now = dataclasses.asdict(s)
    return [f for f in BASE_FIELDS[name] if trained_with.get(f, defaults[f]) != now[f]]


# Settings added after some runs were recorded, with the value those runs had in effect (not today's default).
ADDED_LATER = {"anchor_min_num_math": 0.0, "anchor_extra_rounds": 0}
