"""A training run's checkpoint: the bridge (JSON + safetensors, as persistence saves it), AdamW's moments
(optimizer_state) and the trainer's step, history and accuracy curve; written to a temporary folder and renamed into
place, so a checkpoint is either complete or absent. Resuming from one continues exactly: batches and noise are
functions of (seed, step), so a resumed run equals the uninterrupted one."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import load_file, save_file

from ..engine.persistence import save_bridge
from ..errors import CALMError
from .optimizer_state import flatten_optimizer, load_optimizer

STATE_FILE = "trainer_state.json"


def save_checkpoint(trainer, directory) -> Path:
    directory = Path(directory)
    if trainer.dist.rank == 0:
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        extra = {"train_config": asdict(trainer.config), "step": trainer.step}
        save = getattr(trainer.calm, "save_trained", None)  # a baseline (baselines.py) saves its own tensors
        save(tmp, extra) if save else save_bridge(trainer.calm, tmp, extra=extra)
        tensors, meta = flatten_optimizer(trainer.optimizer)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        accuracy = trainer.probe.curve if trainer.probe is not None else []
        (tmp / STATE_FILE).write_text(json.dumps({"step": trainer.step, "optimizer": meta, "history": trainer.history,
                                                  "accuracy": accuracy}))
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(tmp, directory)
        if trainer.config.save_total_limit:
            kept = sorted((p for p in directory.parent.glob("step-*") if is_checkpoint(p)), key=lambda p: p.name)
            for old in kept[:-trainer.config.save_total_limit]:
                shutil.rmtree(old, ignore_errors=True)
    trainer.dist.barrier()
    return directory


def is_checkpoint(directory) -> bool:
    return (Path(directory) / STATE_FILE).is_file()


def resume(trainer, directory) -> None:
    """Load a checkpoint written by save_checkpoint into `trainer` (its bridge must fit the checkpoint's)."""
    from ..engine.persistence import check_calm_fits, load_bridge_weights, read_description

    directory = Path(directory)
    if hasattr(trainer.calm, "save_trained"):
        raise CALMError("Resuming is for bridges; train a baseline again from the start.")
    check_calm_fits(read_description(directory), trainer.calm)
    if not is_checkpoint(directory):
        raise CALMError(f"{directory} is a bridge but not a training checkpoint (no {STATE_FILE}).")
    load_bridge_weights(trainer.calm, directory)
    state = json.loads((directory / STATE_FILE).read_text())
    load_optimizer(trainer.optimizer, load_file(str(directory / "optimizer.safetensors")), state["optimizer"])
    trainer.step, trainer.history[:] = state["step"], state["history"]
    if trainer.probe is not None:
        trainer.probe.curve[:] = state.get("accuracy", [])
