"""The optimizer's state as flat tensors (safetensors) plus JSON, and back: how a training
checkpoint stores AdamW's moments so that a resumed run continues exactly."""
from __future__ import annotations

import torch


def flatten_optimizer(optimizer) -> tuple[dict, dict]:
    state = optimizer.state_dict()
    tensors, meta = {}, {"param_groups": state["param_groups"], "state": {}}
    for index, entry in state["state"].items():
        meta["state"][str(index)] = []
        for name, value in entry.items():
            tensors[f"{index}.{name}"] = torch.as_tensor(value).detach().clone().contiguous()
            meta["state"][str(index)].append(name)
    return tensors, meta


def load_optimizer(optimizer, tensors: dict, meta: dict) -> None:
    state = {int(i): {name: tensors[f"{i}.{name}"] for name in names} for i, names in meta["state"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
