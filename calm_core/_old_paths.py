"""Module paths from before calm_core was split into layers (calm_core.tiny, calm_core.data, ...) keep working:
each old name is the new module itself (same object, so patching one patches the other). Kept for outside code;
new code imports the layered paths."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

OLD_PATHS = {
    "alignment": "engine.alignment", "anchor_prefix": "engine.anchor_prefix",
    "batched_generation": "engine.batched_generation", "bridge": "engine.bridge", "compose": "engine.compose",
    "config": "engine.config", "generation": "engine.generation", "persistence": "engine.persistence",
    "gguf_files": "models.gguf_files", "adapters": "models.adapters", "tiny": "models.tiny",
    "data": "training.data", "data_arrow": "training.data_arrow", "batches": "training.batches",
    "prepared_rows": "training.prepared_rows", "anchor_targets": "training.anchor_targets",
    "frozen_cache": "training.frozen_cache", "train_config": "training.config",
    "optimizer_state": "training.optimizer_state", "distributed": "training.distributed",
    "vocab_init": "training.vocab_init", "evaluation": "training.evaluation",
    "bounds": "lab.bounds", "resources": "lab.resources", "presets": "lab.presets", "figures": "lab.figures",
    "model_cache": "lab.model_cache", "bridge_files": "lab.bridge_files",
}  # calm_core.models, .training and .lab are packages now and re-export their old names; real_pair is a file


class _OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        package, _, leaf = fullname.rpartition(".")
        if package != "calm_core" or leaf not in OLD_PATHS:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module("calm_core." + OLD_PATHS[spec.name.rpartition(".")[2]])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):  # the import system stamped the alias spec on it: give back the real one
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    if not any(isinstance(finder, _OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OldPathFinder())
