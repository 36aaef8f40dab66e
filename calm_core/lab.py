"""One user's experiment: the models, bridge, data, training run and last results behind one
browser session of the app (or a notebook). Base models are shared through a process-wide
cache; the bridge and everything else belong to the session."""
from __future__ import annotations

import shutil
import tempfile
import threading
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .compose import ComposedLM
from .config import CALMConfig
from .data import DataConfig, DataSplits, load_examples, load_splits
from .errors import CALMError
from .models import load_causal_lm
from .persistence import CONFIG_NAME, WEIGHTS_NAME
from .presets import Preset, load_preset
from .training import TrainConfig, Trainer

MAX_BRIDGE_BYTES = 512 * 2**20


class ModelCache:
    """Loaded (model, tokenizer) pairs by name, least recently used dropped first."""

    def __init__(self, max_models: int = 6):
        self.max_models, self._models, self._lock = max_models, OrderedDict(), threading.Lock()

    def get(self, name: str, dtype=None, trust_remote_code: bool = False):
        key = (str(name), str(dtype), trust_remote_code)
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            check_memory(str(name), dtype)
            try:
                pair = load_causal_lm(str(name), dtype=dtype, trust_remote_code=trust_remote_code)
            except (MemoryError, torch.OutOfMemoryError) as exc:
                raise CALMError(f"{name} does not fit in this machine's memory; choose a smaller model.") from exc
            self._models[key] = pair
            while len(self._models) > self.max_models:
                self._models.popitem(last=False)
            return pair


def check_memory(name: str, dtype=None) -> None:
    """Refuse a model whose weights alone would not fit in the free memory, before loading it."""
    try:
        import psutil
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(name).get_text_config()
    except Exception:
        return  # loading will report what is wrong
    width = getattr(config, "hidden_size", 0) or 0
    layers = getattr(config, "num_hidden_layers", 0) or 0
    vocab = getattr(config, "vocab_size", 0) or 0
    params = 12 * layers * width * width + 2 * vocab * width
    need = params * (2 if dtype in (torch.bfloat16, torch.float16) else 4)
    free = psutil.virtual_memory().available
    if need > 0.8 * free:
        raise CALMError(f"{name} needs about {need / 2**30:.1f} GB for its weights but only {free / 2**30:.1f} GB "
                        f"are free; choose a smaller model or a 16-bit dtype.")


MODEL_CACHE = ModelCache()


@dataclass
class RunState:
    """What the app shows about the current or last training run."""

    total: int = 0
    step: int = 0
    running: bool = False
    message: str = ""
    history: list[dict] = field(default_factory=list)

    def status(self) -> str:
        last = self.history[-1] if self.history else {}
        parts = [f"Step {self.step}/{self.total}"]
        if last:
            parts.append(f"loss {last['loss']:.4f}")
            if last.get("val_loss") is not None:
                parts.append(f"validation loss {last['val_loss']:.4f}")
            parts.append(f"{last['tokens_per_s']:.0f} tokens/s")
        return " · ".join(parts) + (f"\n\n{self.message}" if self.message else "")


class LabSession:
    def __init__(self, cache: ModelCache = MODEL_CACHE):
        self.cache = cache
        self.calm: ComposedLM | None = None
        self.names: list[str] = []
        self.preset: Preset | None = None
        self.splits: DataSplits | None = None
        self.run = RunState()
        self.trainer: Trainer | None = None
        self._thread: threading.Thread | None = None
        self._solo: dict[int, ComposedLM] = {}

    # ---- models -------------------------------------------------------------------------------

    def build(self, anchor: str, augments: list[str], config: CALMConfig | None = None, bridge: str | Path | None = None,
              dtype=None, trust_remote_code: bool = False) -> ComposedLM:
        """Compose the named models (a new bridge, or a saved one). The previous composition stays
        in place if anything fails."""
        self._refuse_while_training("change the models")
        anchor, augments = str(anchor).strip(), [str(a).strip() for a in augments if str(a).strip()]
        if not anchor or not augments:
            raise CALMError("Choose an anchor model and at least one augmenting model.")
        pairs = [self.cache.get(n, dtype, trust_remote_code) for n in [anchor] + augments]
        if bridge is not None:
            calm = ComposedLM.from_pretrained(bridge, anchor=pairs[0], augments=pairs[1:])
        else:
            calm = ComposedLM(pairs[0], pairs[1:], config or CALMConfig())
        self.calm, self.names, self._solo, self.run = calm, [anchor] + augments, {}, RunState()
        return calm

    def use_preset(self, name: str) -> Preset:
        preset = load_preset(name)
        self.build(str(preset.anchor), [str(p) for p in preset.augments], bridge=preset.bridge)
        self.preset = preset
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
        calm = self.require()
        self._refuse_while_training("reset the bridge")
        pairs = [(m.model, m.tokenizer) for m in [calm.anchor] + calm.augments]
        self.calm, self.run = ComposedLM(pairs[0], pairs[1:], config or calm.config), RunState()
        return self.calm

    # ---- data ---------------------------------------------------------------------------------

    def set_data(self, path, column_map: dict | None = None, validation_path=None, validation_fraction: float = 0.1) -> DataSplits:
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
        calm = self.require()
        self._refuse_while_training("start another")
        if self.splits is None:
            raise CALMError("No training data: upload a file or pick a preset data set first.")
        self.run = RunState(total=config.steps, running=True)
        self.trainer = Trainer(calm, self.splits.train, self.splits.validation, config, callback=self._record)
        self.trainer.step = 0
        self._thread = threading.Thread(target=self._train, name="calm-training", daemon=True)
        self._thread.start()
        return self.run

    def _record(self, record: dict) -> None:
        self.run.history.append(record)
        self.run.step = record["step"]

    def _train(self) -> None:
        try:
            result = self.trainer.train()
            self.run.step, self.run.message = result.step, result.message or f"Finished {result.step} steps."
            if result.truncated:
                self.run.message += f" {result.truncated} examples were truncated to the models' context."
        except CALMError as exc:
            self.run.message = str(exc)
        except Exception as exc:  # surfaced in the page; the bridge keeps its last state
            self.run.message = f"Training failed: {type(exc).__name__}: {exc}"
        finally:
            self.run.running = False

    def stop_training(self) -> None:
        if self.trainer is not None:
            self.trainer.request_stop()

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- chat and inspection ------------------------------------------------------------------

    def replies(self, prompt, max_new_tokens: int = 32, gate_scale: float = 1.0, layers_off=(), **sampling):
        """Streams the composition, the anchor alone and the first augmenting model alone,
        interleaved: yields the three texts so far after each new piece."""
        calm = self.require()
        with calm.gate_scale(gate_scale), calm.layers_off(layers_off):
            streams = [calm.stream(prompt, max_new_tokens=max_new_tokens, **sampling)]
        streams += [self.solo(0).stream(prompt, max_new_tokens=max_new_tokens, **sampling),
                    self.solo(1).stream(prompt, max_new_tokens=max_new_tokens, **sampling)]
        texts, live = ["", "", ""], [True, True, True]
        while any(live):
            for i, stream in enumerate(streams):
                if live[i]:
                    piece = next(stream, None)
                    if piece is None:
                        live[i] = False
                    else:
                        texts[i] += piece
                        yield tuple(texts)
        yield tuple(texts)

    def attention(self, text: str):
        calm = self.require()
        if not text.strip():
            raise CALMError("Give a text to look at.")
        with torch.no_grad(), calm.record_attention() as record:
            calm.logits([text])
        return record

    # ---- evaluation ---------------------------------------------------------------------------

    def evaluate(self, path, metrics, max_new_tokens: int = 16, limit: int | None = None, column_map=None, progress=None):
        from .evaluation import evaluate

        examples, _, _ = load_examples(path, DataConfig(column_map=column_map))
        if limit:
            examples = examples[: int(limit)]
        return evaluate(self.require(), examples, metrics, max_new_tokens, progress)

    # ---- bridge files -------------------------------------------------------------------------

    def export_bridge(self, directory) -> Path:
        """The bridge as a zip of bridge_config.json + bridge.safetensors."""
        folder = Path(directory) / "bridge"
        self.require().save_pretrained(folder)
        archive = Path(directory) / "calm-bridge.zip"
        with zipfile.ZipFile(archive, "w") as z:
            for name in (CONFIG_NAME, WEIGHTS_NAME):
                z.write(folder / name, name)
        return archive

    def import_bridge(self, files: list) -> ComposedLM:
        """Load a bridge from a zip, or from its two files, onto the current models."""
        calm = self.require()
        self._refuse_while_training("load another bridge")
        paths = [Path(f) for f in files if f]
        if not paths:
            raise CALMError("Upload a bridge: a .zip, or bridge_config.json with bridge.safetensors.")
        if sum(p.stat().st_size for p in paths) > MAX_BRIDGE_BYTES:
            raise CALMError(f"A bridge upload is limited to {MAX_BRIDGE_BYTES // 2**20} MB.")
        folder = Path(tempfile.mkdtemp(prefix="calm-bridge-"))
        try:
            for path in paths:
                if path.suffix == ".zip":
                    _extract_bridge(path, folder)
                elif path.name.endswith(".json"):
                    shutil.copy(path, folder / CONFIG_NAME)
                elif path.name.endswith(".safetensors"):
                    shutil.copy(path, folder / WEIGHTS_NAME)
                else:
                    raise CALMError(f"{path.name} is not part of a bridge (expected .zip, .json or .safetensors).")
            pairs = [(m.model, m.tokenizer) for m in [calm.anchor] + calm.augments]
            try:
                self.calm = ComposedLM.from_pretrained(folder, anchor=pairs[0], augments=pairs[1:])
            except CALMError as exc:  # name the user's files, not the temporary folder
                raise CALMError(str(exc).replace(str(folder), ", ".join(p.name for p in paths))) from exc
            self.run = RunState()
            return self.calm
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _extract_bridge(archive: Path, folder: Path) -> None:
    """Only the two bridge files, by name, size-checked: nothing else in an upload is written."""
    try:
        with zipfile.ZipFile(archive) as z:
            members = {Path(i.filename).name: i for i in z.infolist() if not i.is_dir()}
            for name in (CONFIG_NAME, WEIGHTS_NAME):
                info = members.get(name)
                if info is None:
                    raise CALMError(f"{archive.name} holds no {name}.")
                if info.file_size > MAX_BRIDGE_BYTES:
                    raise CALMError(f"{name} in {archive.name} is larger than {MAX_BRIDGE_BYTES // 2**20} MB.")
                (folder / name).write_bytes(z.read(info))
    except zipfile.BadZipFile as exc:
        raise CALMError(f"{archive.name} is not a valid zip file.") from exc


def model_rows(calm: ComposedLM) -> list[list]:
    """One row per model for the Models tab: role, name, architecture, layers, width, heads, parameters."""
    rows = []
    for role, member in [("anchor", calm.anchor)] + [(f"augment {k}", m) for k, m in enumerate(calm.augments)]:
        info = member.info
        rows.append([role, info.name, info.architecture, info.num_layers, info.width, info.num_heads, f"{info.num_parameters:,}"])
    trainable, _ = calm.num_parameters()
    rows.append(["bridge", "trained", "gated cross-attention", len(calm.bridge.blocks()), calm.anchor.info.width,
                 calm.config.num_heads or calm.anchor.info.num_heads, f"{trainable:,}"])
    return rows


def layer_labels(calm: ComposedLM) -> list[str]:
    return [f"{i}: anchor L{b} ← augment {k} L{a}" for i, (k, b, a) in enumerate(calm.layer_pairs())]
