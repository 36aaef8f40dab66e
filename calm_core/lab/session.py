"""One user's experiment: the models, bridge, data, training run and last results behind one
browser session of the app (or a notebook). Base models are shared through a process-wide
cache; the bridge and everything else belong to the session. Every request is checked against
the bounds of the models and the memory free before work starts (bounds.py, resources.py)."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..engine.compose import ComposedLM
from ..engine.config import CALMConfig
from ..errors import CALMError
from ..training.data import DataConfig, DataSplits, load_examples, load_splits
from ..training.trainer import TrainConfig, Trainer
from . import bounds, bridge_files, comparison, replies
from .model_cache import MODEL_CACHE, ModelCache, default_dtype
from .model_table import layer_labels, model_rows, short_name
from .presets import Preset, load_preset
from .resources import (
    LEDGER,
    attention_map_bytes,
    data_bytes,
    device_of_calm,
    frozen_cache_bytes,
    generation_bytes,
    training_bytes,
)

__all__ = ["LabSession", "ModelCache", "RunState", "layer_labels", "model_rows", "short_name"]

MAX_RUNS = int(os.environ.get("CALM_MAX_RUNS", "8"))  # training runs at once in this process
RUNS = threading.BoundedSemaphore(MAX_RUNS)


@dataclass
class RunState:
    """What the app shows about the current or last training run."""

    total: int = 0
    step: int = 0
    running: bool = False
    message: str = ""
    prepared: tuple[int, int] = (0, 0)  # examples prepared so far, of how many (before the first step)
    history: list[dict] = field(default_factory=list)

    def status(self) -> str:
        last = self.history[-1] if self.history else {}
        parts = [f"Step {self.step}/{self.total}"]
        if last:
            parts.append(f"loss {last['loss']:.4f}")
            if last.get("val_loss") is not None:
                parts.append(f"validation loss {last['val_loss']:.4f}")
            recent = [h["tokens_per_s"] for h in self.history[-5:]]  # smoothed: one window can be a few ms
            parts.append(f"{sum(recent) / len(recent):.0f} tokens/s")
        elif self.running and self.prepared[1]:
            parts.append(f"preparing examples {self.prepared[0]:,}/{self.prepared[1]:,}")
        return " · ".join(parts) + (f"\n\n{self.message}" if self.message else "")


class LabSession:
    def __init__(self, cache: ModelCache = MODEL_CACHE):
        self.cache = cache
        self.calm: ComposedLM | None = None
        self.names: list[str] = []
        self.preset: Preset | None = None
        self.preset_bridge = False  # the bridge is the preset's shipped one (perhaps trained further)
        self.splits: DataSplits | None = None
        self.run = RunState()
        self.trainer: Trainer | None = None
        self._thread: threading.Thread | None = None
        self._solo: dict[int, ComposedLM] = {}
        self.baselines: dict = {}  # method -> AnchorBaseline trained on this session's anchor
        self._lock = threading.Lock()

    # ---- models -------------------------------------------------------------------------------

    def build(self, anchor: str, augments: list[str], config: CALMConfig | None = None, bridge: str | Path | None = None,
              dtype="auto", trust_remote_code: bool = False, adapters: list | None = None) -> ComposedLM:
        """Compose the named models (a new bridge, or a saved one). The previous composition stays
        in place if anything fails. dtype "auto": bf16 on a GPU that supports it, else float32.
        adapters: per augmenting model, a LoRA folder merged into it, or None."""
        self._refuse_while_training("change the models")
        anchor, augments = str(anchor).strip(), [str(a).strip() for a in augments if str(a).strip()]
        if not anchor or not augments:
            raise CALMError("Choose an anchor model and at least one augmenting model.")
        dtype = default_dtype() if dtype == "auto" else dtype
        adapters = list(adapters or []) + [None] * (len(augments) - len(adapters or []))
        pairs = [self.cache.get(anchor, dtype, trust_remote_code)] + [
            self.cache.get(n, dtype, trust_remote_code, adapter=a) for n, a in zip(augments, adapters)]
        if bridge is not None:
            calm = ComposedLM.from_pretrained(bridge, anchor=pairs[0], augments=pairs[1:])
        else:
            calm = ComposedLM(pairs[0], pairs[1:], config or CALMConfig())
        preset = self.preset  # composing a preset's own folders by hand keeps its data sets and prompts
        same = preset is not None and [str(Path(n).resolve()) for n in [anchor] + augments] == [
            str(Path(p).resolve()) for p in [preset.anchor] + preset.augments] and [
            str(a) if a else None for a in adapters] == [str(a) if a else None for a in preset.augment_adapters]
        self.calm, self.names, self._solo, self.run = calm, [anchor] + augments, {}, RunState()
        self.baselines = {}
        self.preset, self.preset_bridge = (preset if same else None), False
        return calm

    def use_preset(self, name: str) -> Preset:
        """The preset's models (float32 everywhere, so its tables hold), bridge and data."""
        preset = load_preset(name)
        self.build(str(preset.anchor), [str(p) for p in preset.augments], bridge=preset.bridge, dtype=None,
                   adapters=preset.augment_adapters)
        self.preset, self.preset_bridge = preset, preset.bridge is not None
        self.splits = None
        if preset.train_file is not None:
            self.set_data(preset.train_file, validation_path=preset.validation_file)
        return preset

    def require(self) -> ComposedLM:
        if self.calm is None:
            raise CALMError("No models yet: pick a preset or two models in the Models tab first.")
        return self.calm

    def solo(self, index: int) -> ComposedLM:
        """A model alone (0: the anchor, k: augmenting model k), generating through the same code."""
        calm = self.require()
        if index not in self._solo:
            member = calm.anchor if index == 0 else calm.augments[index - 1]
            self._solo[index] = ComposedLM((member.model, member.tokenizer), [])
        return self._solo[index]

    def reset_bridge(self, config: CALMConfig | None = None) -> ComposedLM:
        """Start over on the same models: a new bridge with closed gates (the anchor exactly)."""
        calm = self.require()
        self._refuse_while_training("reset the bridge")
        pairs = [(m.model, m.tokenizer) for m in [calm.anchor] + calm.augments]
        self.calm, self.run = ComposedLM(pairs[0], pairs[1:], config or calm.config), RunState()
        self.preset_bridge = False
        return self.calm

    def train_overrides(self) -> dict:
        """TrainConfig fields the Train tab does not show, as the shipped bridge was trained with them: only while
        the bridge is the preset's own (a fixed value path, value_lr_scale 0, suits its vocabulary-map start only)."""
        if not (self.preset_bridge and self.preset):
            return {}
        return {k: float(v) for k, v in self.preset.train.items() if k in Preset.HIDDEN_TRAIN_KEYS}

    def train_config(self, **changes) -> TrainConfig:
        """A Train click's settings: the preset's recorded `train` section over TrainConfig's defaults, then `changes`."""
        known = {k: v for k, v in (self.preset.train if self.preset else {}).items() if k in TrainConfig.__dataclass_fields__}
        return TrainConfig(**{**known, "progress": False, **changes})

    def baseline(self, name: str):
        """The baseline trained last with method `name` ("lora", "finetune"): generate() and logits() as a ComposedLM."""
        return comparison.trained_baseline(self.baselines, name)

    def baseline_columns(self) -> list[tuple[str, object]]:  # (name with its parameter counts, model) per baseline
        return comparison.columns(self.baselines, self.require())

    def has_chat_template(self) -> bool:
        return bool(getattr(self.require().anchor.tokenizer, "chat_template", None))

    # ---- data ---------------------------------------------------------------------------------

    def set_data(self, path, column_map: dict | None = None, validation_path=None, validation_fraction: float = 0.1) -> DataSplits:
        need = data_bytes(path) + (data_bytes(validation_path) if validation_path else 0)
        with LEDGER.reserve(need, f"Reading {Path(path).name}", "Upload a smaller file, or CSV / Parquet rather than "
                            "JSON (JSON is read into Python objects, about 20 bytes per byte of the file)."):
            splits = load_splits(path, validation_path, DataConfig(column_map=column_map, validation_fraction=validation_fraction))
        self.splits = splits
        return splits

    # ---- training -----------------------------------------------------------------------------

    @property
    def training(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _refuse_while_training(self, what: str) -> None:
        if self.training:
            raise CALMError(f"A training run is in progress; stop it before you {what}.")

    def start_training(self, config: TrainConfig) -> RunState:
        """Check the run fits (batch against memory, at the data's longest example), then train in a
        thread of its own; the examples are prepared there, so Stop is answered at once."""
        with self._lock:  # two clicks on Train in one session start one run
            calm = self.require()
            self._refuse_while_training("start another")
            if self.splits is None:
                raise CALMError("No training data: upload a file or pick a preset data set first.")
            return self._start_counted(calm, config)

    def _start_counted(self, calm, config: TrainConfig) -> RunState:
        if not RUNS.acquire(blocking=False):
            raise CALMError(f"{MAX_RUNS} training runs are in progress on this server, as many as it takes at once "
                            "(they share its processors); try again when one has ended.")
        try:
            return self._start(calm, config)
        except BaseException:
            RUNS.release()
            raise

    def _start(self, composed, config: TrainConfig) -> RunState:
        tokens = bounds.longest_tokens(composed, self.splits.train, config.max_length)
        copy = comparison.copy_bytes(composed, config.method)
        with LEDGER.reserve(copy, f"Copying the anchor for the {config.method} baseline", "Free memory first.",
                            device_of_calm(composed)):
            calm = comparison.model_for(composed, config.method)
        need = copy + training_bytes(calm, config.batch_size, tokens) + frozen_cache_bytes(
            calm, config, len(self.splits.train), tokens, self.splits.kept)
        fits = bounds.largest_batch(calm, tokens)
        reservation = LEDGER.reserve(need, f"Training with batch size {config.batch_size:,}",
                                     f"At this data's longest example ({tokens:,} tokens) at most batch size {fits:,} "
                                     "fits now: lower the batch size.", device_of_calm(calm))
        reservation.__enter__()  # held until the run ends, released in _train
        self.run = RunState(total=config.steps, running=True, prepared=(0, len(self.splits.train)))
        try:
            self.trainer = Trainer(calm, self.splits.train, self.splits.validation, config, callback=self._record)
        except BaseException:
            self.run.running = False
            reservation.__exit__(None, None, None)
            raise
        self.trainer.step = 0
        self._thread = threading.Thread(target=self._train, args=(reservation,), name="calm-training", daemon=True)
        self._thread.start()
        return self.run

    def _record(self, record: dict) -> None:
        self.run.history.append(record)
        self.run.step = record["step"]

    def _prepared(self, done: int, total: int) -> None:
        self.run.prepared = (done, total)

    def _train(self, reservation) -> None:
        try:
            result = self.trainer.train(prepare_progress=self._prepared)
            if self.trainer.config.method != "calm":
                self.baselines[self.trainer.config.method] = self.trainer.calm
            self.run.step, self.run.message = result.step, result.message or f"Finished {result.step} steps."
            if result.truncated:
                self.run.message += f" {result.truncated} examples were truncated to the models' context."
            if "over cache_budget_mb" in result.cache_note:  # slower, not wrong: say why
                self.run.message += (" Each step ran both frozen models in full: their states for this data set would "
                                     "not fit the server's cache (fewer or shorter examples would let them).")
        except CALMError as exc:
            self.run.message = str(exc)
        except Exception as exc:  # surfaced in the page; the bridge keeps its last state
            self.run.message = f"Training failed: {type(exc).__name__}: {exc}"
        finally:
            self.run.running = False
            reservation.__exit__(None, None, None)
            RUNS.release()

    def stop_training(self) -> bool:
        """Ask a running run to stop after its current step; False when nothing is running."""
        if not self.training or self.trainer is None:
            return False
        self.trainer.request_stop()
        return True

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- chat and inspection ------------------------------------------------------------------

    def replies(self, prompt, max_new_tokens: int = 32, gate_scale: float = 1.0, layers_off=(), baseline=None,
                **sampling):
        """Streams the composition, the anchor alone, the first augmenting model alone and, if named, a baseline
        trained in this session ("lora", "finetune"), interleaved: yields their texts so far after each new piece."""
        calm = self.require()
        extra = [self.baseline(baseline)] if baseline else []
        max_new_tokens = bounds.max_new_tokens(calm, max_new_tokens)
        from ..engine.generation import render_prompt

        text, _ = render_prompt(calm.anchor.tokenizer, prompt)
        tokens = bounds.check_prompt(calm, text, max_new_tokens)
        needed = generation_bytes(calm, tokens + max_new_tokens) + sum(
            generation_bytes(m, tokens + max_new_tokens, models=1) for m in extra)
        with LEDGER.reserve(needed, "Answering this prompt", "Shorten the prompt or ask for fewer new tokens.",
                            device_of_calm(calm)):
            with calm.gate_scale(gate_scale), calm.layers_off(layers_off):
                streams = [calm.stream(prompt, max_new_tokens=max_new_tokens, **sampling)]
            streams += [m.stream(prompt, max_new_tokens=max_new_tokens, **sampling)
                        for m in (self.solo(0), self.solo(1), *extra)]
            yield from replies.interleave(streams, lambda rate: setattr(self, "last_tokens_per_s", rate))

    def attention(self, text: str, as_chat: bool = False):
        """The cross-attention record of one forward pass over text; as_chat reads it as a user's chat question,
        in the anchor's chat template, the way the Chat tab's chat mode (and a chat preset's training) sends it."""
        calm = self.require()
        if not text or not text.strip():
            raise CALMError("Give a text to look at.")
        from ..engine.generation import render_prompt

        text, anchor_special = render_prompt(calm.anchor.tokenizer, [{"role": "user", "content": text}] if as_chat else text)
        n = bounds.check_attention_text(calm, text)
        with LEDGER.reserve(attention_map_bytes(calm, n, n), "This attention map", "Shorten the text.",
                            device_of_calm(calm)), torch.no_grad(), calm.record_attention() as record:
            calm.forward(calm.encode([text], add_special_tokens=anchor_special, augment_special_tokens=True))
        return record

    # ---- evaluation ---------------------------------------------------------------------------

    def evaluate(self, path, metrics, max_new_tokens: int = 16, limit: int | None = None, column_map=None, progress=None,
                 scoring: str = "exact"):
        """The three-model table on a file, and a row per baseline trained in this session; scoring names how an
        answer is compared with its reference (evaluation.SCORERS: "exact", or a part, as the preset's table did)."""
        from ..training.evaluation import rescore

        calm = self.require()
        max_new_tokens = bounds.max_new_tokens(calm, max_new_tokens)
        with LEDGER.reserve(data_bytes(path), f"Reading {Path(path).name}", "Upload a smaller file."):
            examples, _, _ = load_examples(path, DataConfig(column_map=column_map))
        limit = bounds.whole("examples", limit or 0, 0, len(examples), " (0 = all of them)")
        if (limit or len(examples)) > bounds.MAX_EVAL_EXAMPLES:
            raise CALMError(f"This set has {len(examples):,} examples; one evaluation takes at most "
                            f"{bounds.MAX_EVAL_EXAMPLES:,}: set examples to at most that.")
        if limit:
            examples = examples[:limit]
        longest = bounds.longest_prompt_tokens(calm, examples)  # an answer stops at the context, as the tables' did
        if longest >= bounds.context(calm):
            raise CALMError(f"The longest prompt here is {longest:,} tokens; these models read at most "
                            f"{bounds.context(calm):,}: shorten the prompts.")
        with LEDGER.reserve(generation_bytes(calm, min(longest + max_new_tokens, bounds.context(calm))), "This evaluation",
                            "Ask for fewer new tokens.", device_of_calm(calm)):
            table = comparison.evaluate_all(calm, list(examples), metrics, max_new_tokens, progress, self.baselines)
        return rescore(table, [e.completion for e in examples], scoring)

    # ---- bridge files -------------------------------------------------------------------------

    def export_bridge(self, directory) -> Path:
        return bridge_files.export_bridge(self.require(), directory)

    def import_bridge(self, files: list) -> str:
        """Load a bridge onto the current models; returns a warning when it was made for others."""
        calm = self.require()
        self._refuse_while_training("load another bridge")
        self.calm, warning = bridge_files.import_bridge(calm, files)
        self.run, self._solo, self.preset_bridge = RunState(), {}, False
        return warning
