"""Saving and loading the bridge alone, PEFT-style: a JSON config plus one safetensors file."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import load_file, save_file

from ..errors import CALMError, IncompatibleBridgeError
from .config import CALMConfig

CONFIG_NAME = "bridge_config.json"
WEIGHTS_NAME = "bridge.safetensors"
FORMAT_VERSION = 1


def bridge_description(calm, directory: Path | None = None) -> dict:
    """Everything a bridge needs to be rebuilt and checked against the models it is loaded onto.
    Models from local folders are also recorded relative to the bridge, so a repository or run
    folder that moves keeps working."""
    def record(info):
        entry = asdict(info)
        if directory is not None and Path(info.name).is_dir():
            entry["relative_path"] = os.path.relpath(Path(info.name).resolve(), Path(directory).resolve())
        return entry

    return {
        "format": "calm-bridge",
        "format_version": FORMAT_VERSION,
        "config": calm.config.to_dict(),
        **({"recipe": calm.recipe} if getattr(calm, "recipe", None) else {}),
        "anchor": record(calm.anchor.info),
        "augments": [
            {**record(member.info), "layer_pairs": [list(p) for p in bridge.pairs]}
            for member, bridge in zip(calm.augments, calm.bridge.augments)
        ],
    }


def model_location(entry: dict, directory) -> str:
    """Where to load a recorded model from: beside the bridge if it was a local folder there."""
    relative = entry.get("relative_path")
    if relative and (Path(directory) / relative).is_dir():
        return str((Path(directory) / relative).resolve())
    return entry["name"]


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_bridge(calm, directory, extra: dict | None = None) -> Path:
    """Write bridge_config.json and bridge.safetensors into directory, each file atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().cpu() for name, t in calm.bridge.state_dict().items()}
    _atomic_write(directory / WEIGHTS_NAME, lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    description = {**bridge_description(calm, directory), **(extra or {})}
    _atomic_write(directory / CONFIG_NAME, lambda p: Path(p).write_text(json.dumps(description, indent=2)))
    return directory


def read_description(directory) -> dict:
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise CALMError(f"{directory} holds no saved bridge: {CONFIG_NAME} is missing.")
    try:
        description = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CALMError(f"{path} is not valid JSON: {exc}") from exc
    if description.get("format") != "calm-bridge":
        raise CALMError(f"{path} is not a CALM bridge config.")
    if not (Path(directory) / WEIGHTS_NAME).is_file():
        raise CALMError(f"{directory} holds no bridge weights: {WEIGHTS_NAME} is missing.")
    return description


def check_fits(description: dict, anchor_info, augment_infos, pairs=None) -> None:
    """Raise IncompatibleBridgeError naming every way the models differ from the saved ones.
    pairs: the layer pairs of the bridge built for these models, when there is one."""
    problems = []
    saved = description["augments"]
    if len(saved) != len(augment_infos):
        problems.append(f"it was made for {len(saved)} augmenting model(s), got {len(augment_infos)}")
    roles = [("anchor", description["anchor"], anchor_info)] + [
        (f"augmenting model {k}", d, info) for k, (d, info) in enumerate(zip(saved, augment_infos))]
    for role, record, info in roles:
        for field in ("width", "num_layers"):
            if record[field] != getattr(info, field):
                problems.append(f"the {role} has {field} {getattr(info, field)} but the bridge was made for "
                                f"{record[field]} ({record['name']})")
    for k, (record, built) in enumerate(zip(saved, pairs or [])):
        if [tuple(p) for p in record["layer_pairs"]] != list(built) and not problems:
            problems.append(f"augmenting model {k}: layer pairs {built} differ from the saved {record['layer_pairs']}")
    if problems:
        raise IncompatibleBridgeError("This bridge does not fit these models: " + "; ".join(problems) + ".")


def check_calm_fits(description: dict, calm) -> None:
    check_fits(description, calm.anchor.info, [m.info for m in calm.augments], [b.pairs for b in calm.bridge.augments])


def load_bridge_weights(calm, directory) -> None:
    state = load_file(str(Path(directory) / WEIGHTS_NAME), device="cpu")
    expected = calm.bridge.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise IncompatibleBridgeError(
            f"The weights in {directory} do not match this bridge: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}, wrong shape {wrong[:5]}."
        )
    calm.bridge.load_state_dict(state)


def load_composed(cls, wrap, directory, anchor=None, augments=None, dtype=None, trust_remote_code=False):
    """`cls` is ComposedLM and `wrap` its Member.wrap, passed in so that this module never imports compose."""
    description = read_description(directory)
    config = CALMConfig.from_dict(description["config"])
    # The saved pairs are the truth: they survive even if how `every` is resolved ever changes.
    if description["augments"]:
        pairs = description["augments"][0]["layer_pairs"]
        if all(d["layer_pairs"] == pairs for d in description["augments"]):
            config.anchor_layers = [b for b, _ in pairs]
            config.augment_layers = [a for _, a in pairs]
    if anchor is None:
        calm = cls.from_names(model_location(description["anchor"], directory),
                              [model_location(d, directory) for d in description["augments"]],
                              config, dtype=dtype, trust_remote_code=trust_remote_code)
    else:
        members = [wrap(pair) for pair in [anchor] + list(augments or [])]
        check_fits(description, members[0].info, [m.info for m in members[1:]])
        calm = cls(anchor, augments or [], config)
    check_calm_fits(description, calm)
    load_bridge_weights(calm, directory)
    calm.recipe = dict(description.get("recipe") or {})  # a trained bridge: no recipe starts it again
    return calm
