"""One user's experiment: the models, bridge, data, training run and last results behind one
browser session of the app (or a notebook). Base models are shared through a process-wide
cache; the bridge and everything else belong to the session. Every request is checked against
the bounds of the models and the memory free before work starts (bounds.py, resources.py)."""
from __future__ import annotations

import threading
from pathlib import Path

import torch

from ..engine.compose import ComposedLM
from ..engine.config import CALMConfig
from ..errors import CALMError
from ..training import recipes
from ..training.config import TrainConfig
from ..training.data import DataConfig, DataSplits, load_examples, load_splits
from . import bounds, bridge_files, comparison, priority, replies, run_settings
from .model_cache import MODEL_CACHE, ModelCache, default_dtype, fast_bf16
from .model_table import layer_labels, model_rows, short_name
from .presets import Preset, load_preset, prepare_models
from .resources import LEDGER, attention_map_bytes, data_bytes, device_of_calm, generation_bytes
from .run_store import RunStore, data_fingerprint
from .training_run import MAX_RUNS, RUNS, RunState, TrainingRuns  # noqa: F401  (the session's public names)

# a preset's `train.bf16` may say this instead of true / false: bf16 autocast where the processor computes bf16
# natively (a GPU, a CPU with AVX512-BF16 or AMX: the real preset's run 8.4 instead of 9.1-10.8 min), float32 elsewhere
NATIVE_BF16 = "native"

__all__ = ["LabSession", "ModelCache", "RunState", "layer_labels", "model_rows", "short_name"]


class LabSession(TrainingRuns):
    def __init__(self, cache: ModelCache = MODEL_CACHE):
        self.cache = cache
        self.calm: ComposedLM | None = None
        self.names: list[str] = []
        self.preset: Preset | None = None
        self.preset_bridge = False  # the bridge is the preset's shipped one (perhaps trained further)
        self.splits: DataSplits | None = None
        self.run = RunState()
        self.trainer = None  # the Trainer of the current or last run
        self.record = None  # the kept record (run_store.RunRecord) of the current or last run
        self._thread: threading.Thread | None = None
        self._solo: dict[int, ComposedLM] = {}
        self.baselines: dict = {}  # method -> AnchorBaseline trained on this session's anchor
        self.recipe = recipes.DEFAULT_RECIPE  # how Train starts a new bridge (a preset's: the one it was made with)
        self.adapters: list[str | None] = []  # per augmenting model, the LoRA folder merged into it
        self.data_info: dict = {}  # where the training data came from (runs record it; resuming checks it)
        self.loaded_settings: dict = {}  # TrainConfig fields from a settings file the Train tab loaded
        self.runs = RunStore()  # every run of this session, kept (run_store.py)
        self._lock = threading.Lock()

    def close(self) -> None:
        """The session ends (its page went away): stop its run, remove its runs folder."""
        self.stop_training()
        self.wait(30)
        self.runs.close()

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
        self.adapters = [str(a) if a else None for a in adapters]
        self.baselines = {}
        self.preset, self.preset_bridge = (preset if same else None), False
        return calm

    def use_preset(self, name: str, progress=None) -> Preset:
        """The preset's models (float32 everywhere, so its tables hold), bridge and data. A preset on the
        real pair prepares the pair first where this machine has not yet (progress(fraction, message))."""
        prepare_models(name, progress=progress)
        preset = load_preset(name)
        self.build(str(preset.anchor), [str(p) for p in preset.augments], bridge=preset.bridge, dtype=None,
                   adapters=preset.augment_adapters)
        self.preset, self.preset_bridge = preset, preset.bridge is not None
        self.recipe, self.loaded_settings = preset.recipe, {}
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

    def set_recipe(self, name: str) -> recipes.Recipe:
        """The recipe Train uses from now on (its start applies to a new bridge: Start over)."""
        recipe = recipes.get_recipe(name)
        self.recipe = recipe.name
        return recipe

    def train_config(self, **changes) -> TrainConfig:
        """Everything pressing Train starts when no field was touched: the session's recipe with its learning-rate
        scales, the preset's recorded `train` section (its scales only under the preset's own recipe; bf16 "native"
        resolved for this machine), the app's schedule (40 logs, 5 validations and one at the end, warm-up over
        min(20, a tenth of the steps)), then `changes`."""
        recipe = recipes.get_recipe(changes.get("recipe", self.recipe))
        own = self.preset is not None and recipe.name == self.preset.recipe
        shipped = {k: v for k, v in (self.preset.train if self.preset else {}).items()
                   if k in TrainConfig.__dataclass_fields__ and (own or k not in recipe.train_fields())}
        if shipped.get("bf16") == NATIVE_BF16:  # the preset's precision follows the processor
            shipped["bf16"] = fast_bf16(device_of_calm(self.calm).type if self.calm is not None else None)
        steps = int(changes.get("steps", self.loaded_settings.get("steps", shipped.get("steps", TrainConfig.steps))))
        scoring = self.preset.scoring(self.preset.held_out_label()) if self.preset else "exact"
        return TrainConfig(**{**bounds.schedule(steps), **recipe.train_fields(), **shipped, "recipe": recipe.name,
                              "progress": False, "accuracy_scoring": scoring, **self.loaded_settings, **changes})

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
        self.data_info = {"train": str(Path(path).resolve()), "source": splits.source,
                          "validation": str(Path(validation_path).resolve()) if validation_path else None,
                          "validation_fraction": validation_fraction, "column_map": column_map or None,
                          "examples": len(splits.train), "fingerprint": data_fingerprint(splits),
                          "preset": self.preset.name if self.preset else None}
        return splits

    def load_settings(self, path_or_text) -> tuple[dict, str]:
        """A settings file (YAML or JSON, as a run exports it) for the next Train: every key checked. Returns the
        fields and a note of what the file asked for that the session does not have (other models or data)."""
        fields = run_settings.read_settings(path_or_text)
        source = fields.pop("_source")
        if "recipe" in fields:
            self.set_recipe(fields["recipe"])
        self.loaded_settings = {k: v for k, v in fields.items() if k != "recipe"}
        notes = []
        if source.get("anchor") and [source.get("anchor")] + list(source.get("augment") or []) != self.names:
            notes.append("it was made for " + " + ".join([str(source.get("anchor"))] + [str(a) for a in
                         source.get("augment") or []]) + "; the session's models stay")
        if source.get("data") and str(Path(str(source["data"])).resolve()) != self.data_info.get("train"):
            notes.append(f"it names the data {Path(str(source['data'])).name}; the session's data stay")
        return fields, "; ".join(notes)

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
            with priority.interactive():  # a training run on this server waits for this reply (priority.py)
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
                            device_of_calm(calm)), torch.no_grad(), priority.interactive(), \
                calm.record_attention() as record:
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
