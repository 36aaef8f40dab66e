"""Presets: a trained model pair, its bridge and its data sets, shipped in the repository so that
the app starts offline with something that works.

Layout of presets/<name>/: anchor/ and augment/ (save_pretrained model + tokenizer), bridge/
(ComposedLM.save_pretrained), data/*.jsonl, and preset.json with at least a title and a
description; optional: example_prompts, eval_files {label: path}, table, paper_table,
max_new_tokens, prompt_mode ("completion" or "chat"), paper_table_title, metrics (the
evaluation metrics that suit the preset's data, e.g. ["chrf", "bleu"] for translation), and how
the table was measured, so that the Evaluate tab measures the same way: eval_max_new_tokens,
eval_scoring {set: "exact" | "substitution" | "result"} and eval_table_rows {set: {metric: table
row}}. A table.json beside preset.json (written by the demo's report) takes precedence for the
tables, their title and the protocol.

A preset may also name its models instead of shipping them: "anchor_model" / "augment_model" as
"real_pair:<key>" (the real pair, prepared once per machine: at first use, see prepare_models, or by
`python -m calm_core.models.real_pair`), with an optional "augment_adapter" (a peft LoRA folder inside the
preset, merged into the augmenting model when it loads)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CALMError
from .resources import GB, LEDGER

PREPARE_BYTES = 3 * GB  # converting Gemma 3 270M's GGUF file: its float32 weights about twice over, and the tokenizer
PRESETS_DIR = Path(os.environ.get("CALM_PRESETS_DIR", Path(__file__).resolve().parents[2] / "presets"))


@dataclass
class Preset:
    name: str
    title: str
    description: str
    root: Path
    anchor: Path
    augments: list[Path]
    bridge: Path | None
    data_files: dict[str, Path]  # every data file of the preset, by file name
    eval_files: dict[str, Path] = field(default_factory=dict)
    example_prompts: list[str] = field(default_factory=list)
    table: dict | None = None
    paper_table: dict | None = None
    max_new_tokens: int = 16
    prompt_mode: str = "completion"
    paper_table_title: str = "Reproduction of the paper's Table 1 (accuracy %)"
    metrics: list[str] = field(default_factory=lambda: ["exact_match", "loss"])
    eval_max_new_tokens: int | None = None
    eval_scoring: dict[str, str] = field(default_factory=dict)
    eval_table_rows: dict[str, dict[str, str]] = field(default_factory=dict)
    protocol: str = ""
    augment_adapters: list[Path | None] = field(default_factory=list)  # per augmenting model, a LoRA folder or None
    question_forms: dict[str, list[str]] = field(default_factory=dict)
    # how the shipped bridge was trained: the Train tab's fields (steps, lr, batch_size, gate_lr_scale,
    # augment_noise) start here, and position_lr_scale / value_lr_scale apply while the bridge is the shipped one
    train: dict = field(default_factory=dict)
    recipe: str = "plain"  # how its bridge started (training/recipes.py); Start over keeps it

    def scoring(self, label: str | None) -> str:
        return self.eval_scoring.get(label, "exact")

    def held_out_label(self) -> str | None:
        """The evaluation set of questions the bridge never trained on (its name says held-out), else the first."""
        return next((n for n in self.eval_files if "held-out" in n), next(iter(self.eval_files), None))

    def table_cells(self, label: str) -> dict[str, dict]:
        """{metric: {column: value}} of our table for one evaluation set (exact match: the row of the same name)."""
        rows = self.eval_table_rows.get(label) or ({"exact_match": label} if label in (self.table or {}) else {})
        return {metric: (self.table or {}).get(row, {}) for metric, row in rows.items()}

    def story_markdown(self) -> str:
        """What a student needs to read the preset: its description, and its language or key table."""
        parts = [f"### {self.title}", self.description]
        language = self.root / "language.json"
        if language.is_file():
            meta = json.loads(language.read_text())
            words = ", ".join(f"{en} = *{w}*" for en, w in sorted(meta.get("lexicon", {}).items()))
            rules = "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in meta.items()
                              if k not in ("seed", "lexicon", "coverage") and isinstance(v, (str, int)))
            parts.append(f"**The made-up language** ({rules}). Lexicon: {words}.")
        keys = self.root / "data" / "kv.json"
        if keys.is_file():
            meta = json.loads(keys.read_text())
            values, train, held = meta.get("values", {}), meta.get("train_keys", []), meta.get("heldout_keys", [])
            show = lambda names: ", ".join(f"`{k}` = {values.get(k)}" for k in names[:8])
            parts.append(f"**The key table**: {len(values)} keys. The bridge trained on expressions over {len(train)} of "
                         f"them ({show(train)}, …); the other {len(held)} are held out ({show(held)}, …).")
        world = self.root / "world.json"
        if world.is_file():
            meta = json.loads(world.read_text())
            people = meta.get("people", [])
            held = [p for p in people if p.get("split") == "test"]
            trained = [p for p in people if p.get("split") == "compose"]
            show = lambda group: ", ".join(f"{p['name']} ({p.get('town')})" for p in group[:6])
            forms = "; ".join(f"*{f.format(x='NAME')}*" for fs in self.question_forms.values() for f in fs)
            parts.append(f"**The made-up world**: {len(people)} people, {len(meta.get('towns', []))} towns that only "
                         f"m_A read about. The bridge trained on questions about {len(trained)} of them ({show(trained)}, "
                         f"…); {len(held)} are held out ({show(held)}, …). Ask in a trained form: {forms}. "
                         f"`world.json` in the preset lists everyone.")
        baselines = self.root / "baselines.md"  # demos/preset_baselines.py: the composition against LoRA and others
        if baselines.is_file():
            parts.append(baselines.read_text())
        return "\n\n".join(p for p in parts if p)

    @property
    def train_file(self) -> Path | None:
        return next((p for n, p in self.data_files.items() if "train" in n), next(iter(self.data_files.values()), None))

    @property
    def validation_file(self) -> Path | None:
        return next((p for n, p in self.data_files.items() if "valid" in n), None)

    def comparison_markdown(self) -> str:
        """Our table beside the paper's, as markdown: {row: {column: value}} in preset.json."""
        if not self.paper_table:
            return ""
        ours, paper = self.table or {}, self.paper_table
        columns = list(next(iter(paper.values())).keys())
        lines = ["| data set | " + " | ".join(f"{c} (ours / paper)" for c in columns) + " |",
                 "|---" * (len(columns) + 1) + "|"]
        for row, values in paper.items():
            cells = [f"{_number(ours.get(row, {}).get(c))} / {_number(values.get(c))}" for c in columns]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
        protocol = f"\n\n*{self.protocol}*" if self.protocol else ""
        return f"### {self.paper_table_title}\n" + "\n".join(lines) + protocol



REAL_PAIR_PREFIX = "real_pair:"


def _model_ref(folder: Path, meta: dict, key: str, shipped: Path) -> Path | None:
    """A preset's model: its own folder, or a prepared real-pair model named in preset.json (None: not prepared)."""
    name = meta.get(key)
    if not name:
        return shipped
    if not str(name).startswith(REAL_PAIR_PREFIX):
        raise CALMError(f"Preset {folder.name}: {key} {name!r} is not a real-pair model ({REAL_PAIR_PREFIX}<key>).")
    from ..models.real_pair import MODELS, prepared_pair

    pair_key = str(name)[len(REAL_PAIR_PREFIX):]
    if pair_key not in MODELS:
        raise CALMError(f"Preset {folder.name}: unknown real-pair model {pair_key!r}; known: {sorted(MODELS)}.")
    pair = prepared_pair()
    return None if pair is None else pair[pair_key]


def _usable(folder: Path) -> bool:
    """A preset the app can load here: its own models, or the real pair, prepared on this machine or
    preparable at first use (its packages installed, or pip there to fetch them)."""
    meta_path = folder / "preset.json"
    if not meta_path.is_file():
        return False
    if (folder / "anchor").is_dir():
        return True
    try:
        meta = json.loads(meta_path.read_text())
        if not meta.get("anchor_model"):
            return False
        if _model_ref(folder, meta, "anchor_model", folder / "anchor") is not None:
            return True
    except (ValueError, CALMError):
        return False
    from ..models.real_pair import prepares_at_first_use

    return prepares_at_first_use()


def prepare_real_pair(progress=None) -> dict[str, Path]:
    """The real pair's folders, prepared first where this machine has not yet (once, about 2 min on
    2 cores; progress(fraction, message) hears each step), with its memory held in the ledger meanwhile."""
    from ..models.real_pair import ensure_prepared, prepared_pair

    folders = prepared_pair()
    if folders is not None:
        return folders
    with LEDGER.reserve(PREPARE_BYTES, "Preparing the real pair (converting its GGUF files)",
                        "Try again when other work on this server has finished."):
        return ensure_prepared(progress=progress)


def prepare_models(name: str, root: Path | None = None, progress=None) -> None:
    """Prepare the real pair first where the preset names it and this machine has not prepared it yet."""
    meta_path = Path(root or PRESETS_DIR) / name / "preset.json"
    if not meta_path.is_file():
        return  # load_preset says what is missing
    meta = json.loads(meta_path.read_text())
    if any(str(meta.get(key) or "").startswith(REAL_PAIR_PREFIX) for key in ("anchor_model", "augment_model")):
        prepare_real_pair(progress)


def list_presets(root: Path | None = None) -> list[str]:
    root = Path(root or PRESETS_DIR)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _usable(p))


def load_preset(name: str, root: Path | None = None) -> Preset:
    folder = Path(root or PRESETS_DIR) / name
    meta_path = folder / "preset.json"
    if not meta_path.is_file():
        raise CALMError(f"No preset named {name!r}; available: {list_presets(root) or 'none'}.")
    meta = json.loads(meta_path.read_text())
    tables = folder / "table.json"
    if tables.is_file():  # the demo's report: the tables as measured, their title and protocol
        meta.update({k: v for k, v in json.loads(tables.read_text()).items()
                     if k in ("table", "paper_table", "paper_table_title", "protocol") and v})
    anchor = _model_ref(folder, meta, "anchor_model", folder / "anchor")
    if meta.get("augment_model"):
        augments = [_model_ref(folder, meta, "augment_model", folder / "augment")]
        adapters = [folder / meta["augment_adapter"] if meta.get("augment_adapter") else None]
    else:
        augments = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("augment"))
        adapters = [None] * len(augments)
    if anchor is None or None in augments:
        from ..models.real_pair import PREPARE_COMMAND

        raise CALMError(f"Preset {name} uses the real pair, which is not prepared on this machine yet: the app (or "
                        f"LabSession().use_preset) prepares it at first use, or prepare it now: {PREPARE_COMMAND}")
    data_dir = folder / "data"
    data_files = {p.name: p for p in sorted(data_dir.glob("*")) if p.suffix in (".jsonl", ".csv", ".json", ".parquet", ".txt")} if data_dir.is_dir() else {}
    eval_files = {label: folder / path for label, path in (meta.get("eval_files") or {}).items()}
    return Preset(
        name=name, title=meta.get("title", name), description=meta.get("description", ""), root=folder,
        anchor=anchor, augments=augments, augment_adapters=adapters,
        question_forms=dict(meta.get("question_forms") or {}), bridge=folder / "bridge" if (folder / "bridge").is_dir() else None,
        data_files=data_files, eval_files=eval_files, example_prompts=list(meta.get("example_prompts", [])),
        table=meta.get("table"), paper_table=meta.get("paper_table"),
        max_new_tokens=int(meta.get("max_new_tokens", 16)), prompt_mode=meta.get("prompt_mode", "completion"),
        eval_max_new_tokens=meta.get("eval_max_new_tokens"), eval_scoring=dict(meta.get("eval_scoring") or {}),
        eval_table_rows=dict(meta.get("eval_table_rows") or {}), protocol=meta.get("protocol", ""),
        train=dict(meta.get("train") or {}), recipe=str(meta.get("recipe") or "plain"),
        **{k: meta[k] for k in ("paper_table_title", "metrics") if meta.get(k)},
    )


def _number(value) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.1f}"
