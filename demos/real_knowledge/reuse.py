"""Parts of an earlier run kept instead of computed again: m_A's adapter, and the anchor + LoRA control, which
depends on the composition data alone (neither m_A nor the bridge), when that data is the same byte for byte."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from .augment import adapter_minutes
from .scoring import FT, ROW_SEEN, ROW_TEST


def reused_augment(src: Path, adapter: Path) -> dict:
    """An earlier m_A adapter copied into `adapter`, with its training log, its record (what m_A read beside the
    world, and its probe) and its own training time (not the copy's)."""
    if src.resolve() != adapter.resolve():
        shutil.copytree(src, adapter, dirs_exist_ok=True)
    log_file = adapter / "augment_log.jsonl"
    hist = [json.loads(x) for x in log_file.read_text().splitlines()] if log_file.is_file() else []
    info = {"reused": str(src), "history": hist}
    if (adapter / "augment.json").is_file():
        info["adapter"] = json.loads((adapter / "augment.json").read_text())
    if hist and "minutes" in hist[-1]:
        info["train_s"] = 60.0 * adapter_minutes(hist)
    return info


def reused_finetune(src: Path, out: Path) -> tuple[dict, dict, float, dict]:
    """The anchor + LoRA column of an earlier run on the same composition data: (cells by row, its control record
    with where it came from, its training seconds, its held-out predictions)."""
    name = Path("data") / "composition_train.jsonl"
    if not (src / name).is_file() or (src / name).read_bytes() != (out / name).read_bytes():
        raise SystemExit(f"reuse_finetune: {src / name} is not this run's composition data: train the control")
    earlier = json.loads((src / "table.json").read_text())
    control = (earlier.get("controls") or {}).get("finetune")
    cells = {row: earlier["table"][row][FT] for row in (ROW_TEST, ROW_SEEN) if FT in earlier["table"].get(row, {})}
    if not control or len(cells) < 2:
        raise SystemExit(f"reuse_finetune: {src / 'table.json'} holds no anchor + LoRA control")
    seconds = next(v for k, v in earlier["times_s"].items() if k.startswith("finetune_train_s"))
    origin = f"not rerun here: taken from {src} (the same composition data, byte for byte)" + (
        f"; there: {control['reused_from']}" if control.get("reused_from") else "")
    kept = src / "predictions.json"
    preds = ({k: [r["output"] for r in v] for k, v in json.loads(kept.read_text()).items() if k.startswith("ft/")}
             if kept.is_file() else {})
    return cells, dict(control, reused_from=origin), seconds, preds
