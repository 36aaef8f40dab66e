"""A session's bridge out as a zip and back in from an upload, safely: only the two bridge files
are read from an archive, sizes are capped, and a bridge made for other models is named as such."""
from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from pathlib import Path

from ..engine.persistence import CONFIG_NAME, WEIGHTS_NAME
from ..errors import CALMError

MAX_BRIDGE_BYTES = 512 * 2**20


def export_bridge(calm, directory) -> Path:
    """The bridge as a zip of bridge_config.json + bridge.safetensors."""
    folder = Path(directory) / "bridge"
    calm.save_pretrained(folder)
    archive = Path(directory) / "calm-bridge.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            z.write(folder / name, name)
    return archive


def import_bridge(calm, files: list):
    """(a ComposedLM with the uploaded bridge on calm's models, a warning or ""). Shapes that do not
    fit are refused; a bridge whose recorded models differ in anything else loads with a warning."""
    from ..engine.compose import ComposedLM

    paths = [Path(f) for f in files if f]
    if not paths:
        raise CALMError("Upload a bridge: a .zip, or bridge_config.json with bridge.safetensors.")
    if sum(p.stat().st_size for p in paths) > MAX_BRIDGE_BYTES:
        raise CALMError(f"A bridge upload is limited to {MAX_BRIDGE_BYTES // 2**20} MB.")
    folder = Path(tempfile.mkdtemp(prefix="calm-bridge-"))
    try:
        for path in paths:
            if path.suffix == ".zip":
                _extract(path, folder)
            elif path.name.endswith(".json"):
                shutil.copy(path, folder / CONFIG_NAME)
            elif path.name.endswith(".safetensors"):
                shutil.copy(path, folder / WEIGHTS_NAME)
            else:
                raise CALMError(f"{path.name} is not part of a bridge (expected .zip, .json or .safetensors).")
        pairs = [(m.model, m.tokenizer) for m in [calm.anchor] + calm.augments]
        try:
            loaded = ComposedLM.from_pretrained(folder, anchor=pairs[0], augments=pairs[1:])
        except CALMError as exc:  # name the user's files, not the temporary folder
            raise CALMError(str(exc).replace(str(folder), ", ".join(p.name for p in paths))) from exc
        return loaded, _other_models(json.loads((folder / CONFIG_NAME).read_text()), calm)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _other_models(description: dict, calm) -> str:
    """A warning when the bridge records models other than these (same shapes, other weights)."""
    differences = []
    roles = [("anchor", description.get("anchor", {}), calm.anchor.info)] + [
        (f"augmenting model {k}", d, m.info) for k, (d, m) in enumerate(zip(description.get("augments", []), calm.augments))]
    for role, record, info in roles:
        for field in ("architecture", "vocab_size", "num_parameters", "num_heads"):
            if field in record and record[field] != getattr(info, field):
                differences.append(f"the {role} has {field} {getattr(info, field)}, the bridge's had {record[field]}")
    if not differences:
        return ""
    return ("**Warning:** this bridge was trained for other models (" + "; ".join(differences) + "). Its shapes fit, "
            "so it loaded, but what it learned is about those models: expect meaningless answers.")


def _extract(archive: Path, folder: Path) -> None:
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
