"""A run's settings as a file and as a command, and back: the YAML and the `python -m calm_core train ...` line
use the command line's own option names, so the CLI takes either (`--config FILE`) and reproduces the run (same
models, bridge shape, data, recipe, seed and schedule: the same first steps). The Train tab loads such a file too,
checked key by key against the classroom's bounds; and the settings that differ between runs, for the Runs tab."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..errors import CALMError
from ..training.config import TrainConfig
from . import bounds
from .run_store import RunRecord

# TrainConfig fields the command line takes (the rest are the app's schedule or machine-dependent)
TRAIN_OPTIONS = ("method", "recipe", "steps", "lr", "batch_size", "grad_accum", "warmup_steps", "weight_decay",
                 "gate_lr_scale", "position_lr_scale", "value_lr_scale", "grad_clip", "augment_noise", "log_every",
                 "eval_every", "checkpoint_every", "seed", "bf16", "max_length", "accuracy_examples", "accuracy_share",
                 "accuracy_scoring")
SHAPE_OPTIONS = {"every": "every", "anchor_layers": "anchor_layers", "augment_layers": "augment_layers",
                 "num_heads": "heads", "gate": "gate", "insert": "insert", "recency": "recency",
                 "null_slot": "null_slot", "window": "window", "relative": "relative"}
SOURCE_OPTIONS = ("anchor", "augment", "augment_adapter", "data", "validation", "validation_fraction", "column_map")
MAX_CONFIG_BYTES = 64 * 1024  # a settings file, not a data set
# what a settings file may ask of a shared server: (lowest, highest, lowest excluded), as the Train tab's fields
CLASSROOM_BOUNDS = {
    "steps": (1, bounds.MAX_STEPS, False), "batch_size": (1, bounds.MAX_BATCH, False),
    "lr": (0, bounds.MAX_LR, True), "gate_lr_scale": (0, bounds.MAX_GATE_LR_SCALE, True),
    "augment_noise": (0, bounds.MAX_AUGMENT_NOISE, False), **bounds.ADVANCED_BOUNDS,
    "grad_accum": (1, bounds.MAX_BATCH, False), "warmup_steps": (0, bounds.MAX_STEPS, False),
    "log_every": (1, bounds.MAX_STEPS, False), "eval_every": (1, bounds.MAX_STEPS, False),
    "checkpoint_every": (0, bounds.MAX_STEPS, False), "seed": (0, 2**31 - 1, False), "max_length": (1, 1 << 20, False),
    "grad_clip": (0, 1000, False), "accuracy_examples": (0, 256, False), "accuracy_share": (0, 1, True),
}
REAL_FIELDS = {"lr", "gate_lr_scale", "augment_noise", "grad_clip", "accuracy_share", *bounds.ADVANCED_BOUNDS}


def cli_options(record: RunRecord) -> dict:
    """The run as the command line's options (its argparse names), in the order a reader wants them."""
    options = {"anchor": record.models[0], "augment": record.models[1:]}
    if any(record.adapters):
        options["augment_adapter"] = [a or "" for a in record.adapters]
    options.update({cli: record.bridge_config.get(key) for key, cli in SHAPE_OPTIONS.items()})
    if record.bridge_config.get("norm") is False:
        options["no_norm"] = True
    data = record.data
    options.update({"data": data.get("train"), "validation": data.get("validation")})
    if not data.get("validation"):
        options["validation_fraction"] = data.get("validation_fraction", 0.1)
    if data.get("column_map"):
        options["column_map"] = dict(data["column_map"])
    options.update({k: record.settings[k] for k in TRAIN_OPTIONS if k in record.settings})
    options["no_augment_cache"] = not record.settings.get("cache_augment_states", True)
    return {k: v for k, v in options.items() if v is not None}


def to_yaml(record: RunRecord) -> str:
    import yaml

    head = (f"# {record.id} · {record.name}: the settings of this CALM Lab run.\n"
            f"# Train it again:  python -m calm_core train --config {record.id}.yaml --out runs/{record.id}\n")
    return head + yaml.safe_dump(cli_options(record), sort_keys=False, allow_unicode=True)


def to_command(record: RunRecord, out: str | None = None) -> str:
    """The equivalent command line, every option spelled out."""
    parts = ["python", "-m", "calm_core", "train"]
    for key, value in cli_options(record).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            parts += [flag] if value else []
        elif key in ("augment", "augment_adapter"):
            for item in value:
                parts += [flag, str(item)]
        elif isinstance(value, list):
            parts += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, dict):
            parts += [flag, ",".join(f"{k}={v}" for k, v in value.items())]
        else:
            parts += [flag, str(value)]
    parts += ["--out", out or f"runs/{record.id}"]
    return " ".join(shlex.quote(p) for p in parts)


def read_settings(path_or_text, source: str = "the settings file") -> dict:
    """A YAML or JSON settings file (as exported) -> TrainConfig fields for the Train tab. Every key is checked:
    unknown keys, wrong types and values outside the classroom's bounds get a message naming the key and what it
    allows. Keys that name models, data or the bridge's shape are returned under "_source" (the page says whether
    they match the session's; the session's models and data stay)."""
    import yaml

    text = path_or_text
    if isinstance(path_or_text, Path) or (isinstance(path_or_text, str) and "\n" not in path_or_text
                                          and Path(path_or_text).is_file()):
        path = Path(path_or_text)
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise CALMError(f"{path.name} is {path.stat().st_size:,} bytes; a settings file is at most "
                            f"{MAX_CONFIG_BYTES:,}.")
        source, text = path.name, path.read_text(errors="replace")
    try:
        options = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise CALMError(f"{source} is not YAML or JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(options, dict):
        raise CALMError(f"{source} must hold key: value settings, got {type(options).__name__}.")
    options = {str(k).replace("-", "_"): v for k, v in options.items()}
    shape = set(SHAPE_OPTIONS.values()) | {"no_norm"}
    known = set(TRAIN_OPTIONS) | shape | set(SOURCE_OPTIONS) | {"no_augment_cache", "out", "config", "dtype",
                                                                "no_progress", "cache_budget_mb", "bridge"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise CALMError(f"{source}: unknown setting{'s' * (len(unknown) > 1)} {', '.join(unknown)}. Known: "
                        f"{', '.join(sorted(TRAIN_OPTIONS))}, and the models', data's and bridge's options of "
                        "`python -m calm_core train --help`.")
    fields = {k: options[k] for k in TRAIN_OPTIONS if k in options}
    if "no_augment_cache" in options:
        fields["cache_augment_states"] = not _flag("no_augment_cache", options["no_augment_cache"], source)
    for name, (low, high, low_open) in CLASSROOM_BOUNDS.items():
        if fields.get(name) is not None:
            label = f"{source}: {name}"
            fields[name] = (bounds.whole(label, fields[name], low, high) if isinstance(low, int) and name not in
                            REAL_FIELDS else bounds.real(label, fields[name], low, high, low_open=low_open))
    if "bf16" in fields:
        fields["bf16"] = _flag("bf16", fields["bf16"], source)
    try:
        TrainConfig(**fields)  # the rest of its checks, naming the field
    except (TypeError, CALMError) as exc:
        raise CALMError(f"{source}: {exc}") from None
    fields["_source"] = {k: options[k] for k in options if k in shape or k in SOURCE_OPTIONS}
    return fields


def _flag(name: str, value, source: str) -> bool:
    if not isinstance(value, bool):
        raise CALMError(f"{source}: {name} must be true or false, got {value!r}.")
    return value


def differing(records: list[RunRecord]) -> list[list]:
    """[setting, value in run 1, value in run 2, ...] for every setting, model or data source that differs."""
    def flat(record: RunRecord) -> dict:
        values = {f"settings.{k}": v for k, v in record.settings.items() if k not in ("out_dir", "progress")}
        values.update({f"bridge.{k}": v for k, v in record.bridge_config.items()})
        values.update({"models": " + ".join(record.models), "data": record.data.get("source") or record.data.get("train"),
                       "data fingerprint": record.data.get("fingerprint")})
        return values

    rows, flats = [], [flat(r) for r in records]
    for key in sorted(set().union(*flats)):
        values = [f.get(key) for f in flats]
        if any(json.dumps(v, default=str) != json.dumps(values[0], default=str) for v in values[1:]):
            rows.append([key.removeprefix("settings.")] + ["" if v is None else str(v) for v in values])
    return rows
