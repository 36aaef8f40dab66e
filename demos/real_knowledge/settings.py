"""The real-knowledge run's settings, one dataclass: the world, m_A's LoRA training, the bridge and the controls.
Every default's comment says where it was chosen (a development world) and what it replaced (README)."""
from __future__ import annotations

from dataclasses import dataclass, field

from calm_core import CALMConfig


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
    # names outside the world taught as unknown to m_A ("NAME was born in an unknown town.", not_recorded.py), so
    # that its prediction for a name it never read about is no town and the bridge carries no invention
    augment_unknown: int = 0
    # > 0: m_A reads those names in a second stage of this many epochs (no focused start, a 2-epoch anneal), after
    # it has learned the world, as the shipped preset's m_A did (world 5: 8% of invented names then got a world town
    # from m_A alone); 0: beside the world from the start (fresh world 9: 35%)
    augment_unknown_epochs: int = 0
    # real famous people taught with their true home towns beside them (famous_known.py): taught only unknown names,
    # m_A called famous people unknown too (3/20 expected words through the bridge, 8/20 without)
    augment_famous: int = 0
    # an adapter folder to continue training (e.g. the preset's, with augment_unknown): the bridge trained on it still
    # reads the known people's states much as before
    augment_resume: str | None = None
    # questions per composition person: the three trained forms, and past 3 forms drawn from phrasings.py's grammar
    # (openers, cores, closers, lower case, typos, second turns; never one of probe_forms.NEVER_TRAINED)
    questions_per_person: int = 3
    # "town": the answer is " TOWN"; "sentence": m_A's own encyclopedia phrasing "NAME was born in TOWN." Whatever
    # the question's words, the answer itself then holds the phrase after which m_A names the town, and the bridge
    # reads m_A there (age 0) instead of searching the question for it; scored by naming the town (scoring.py)
    answer_style: str = "town"
    # invented names outside the world asked the same way, trained toward the anchor's own answers (keep_anchor):
    # the bridge learns to stay closed where m_A knows nobody (phrasings.unknown_questions)
    unknown_rows: int = 0
    # their answers: "anchor" (the anchor's own, keep_anchor) or "not_recorded" (NAME was born in an unknown town.,
    # what an m_A trained with augment_unknown predicts there; its words then also weight the value map)
    unknown_answer: str = "anchor"
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
    # world 6 after its run once (development checks 72, 90% at 120, 240 against 3, 60%); fresh worlds 7 and 8
    # then ran it once each: 97.0, 92.0% held out (README)
    recency_init: float = 4.0
    relative: bool = True
    value_init: bool = True  # calm_core.training.vocab_init: the value path starts as a map between the output vocabularies
    # the answer tokens' share of that map's fit: at 0.18 (weight 100, the sixth and seventh sessions' runs) the map
    # ranked the right town first for 84% of m_A's states at the fact (m_A itself: 99.7%), at 0.7 for 99.7% (README)
    value_answer_share: float = 0.7
    # 360, not the 600 of worlds 0-5: on the development world 4 (annealed m_A) the checks read 50, 95, 98% at steps
    # 120, 240, 360, and 600 steps took 22 min on 2 AVX2 cores, past the 15-minute budget (README, twelfth session)
    compose_steps: int = 360
    compose_batch: int = 16
    compose_lr: float = 2e-3
    # autocast the bridge's (and the LoRA control's) training steps: about 1.4x faster on an AMX CPU, 5x slower
    # on one without native bf16; None: calm_core.lab.model_cache.fast_bf16 decides (the run records which)
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

    @classmethod
    def shipped(cls) -> "Settings":
        """The shipped preset's recipe, frozen for fresh worlds (issue 39): the sentence answer, the question grammar,
        100 invented-name rows answered "NAME was born in an unknown town.", 180 steps; m_A learns the world, then
        reads 600 names outside it as unknown in a second stage of 4 epochs (as world 5's m_A did)."""
        return cls(questions_per_person=5, answer_style="sentence", unknown_rows=100, unknown_answer="not_recorded",
                   compose_steps=180, check_every=90, max_new_tokens=16, augment_unknown=600, augment_unknown_epochs=4)

    @classmethod
    def named(cls, name: str) -> "Settings":
        """"default" (the dataclass), "shipped" or "smoke"."""
        return {"default": cls, "shipped": cls.shipped, "smoke": cls.smoke}[name]()

    def calm_config(self) -> CALMConfig:
        return CALMConfig(every=self.every, anchor_layers=self.anchor_layers, augment_layers=self.augment_layers,
                          num_heads=self.num_heads, gate=self.gate, insert=self.insert, window=self.window, null_slot=self.null_slot,
                          recency=self.recency, relative=self.relative)
