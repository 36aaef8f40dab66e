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
tables, their title and the protocol."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CALMError

PRESETS_DIR = Path(os.environ.get("CALM_PRESETS_DIR", Path(__file__).resolve().parents[1] / "presets"))


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

    def scoring(self, label: str) -> str:
        return self.eval_scoring.get(label, "exact")

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



def list_presets(root: Path | None = None) -> list[str]:
    root = Path(root or PRESETS_DIR)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "preset.json").is_file() and (p / "anchor").is_dir())


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
    augments = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("augment"))
    data_dir = folder / "data"
    data_files = {p.name: p for p in sorted(data_dir.glob("*")) if p.suffix in (".jsonl", ".csv", ".json", ".parquet", ".txt")} if data_dir.is_dir() else {}
    eval_files = {label: folder / path for label, path in (meta.get("eval_files") or {}).items()}
    return Preset(
        name=name, title=meta.get("title", name), description=meta.get("description", ""), root=folder,
        anchor=folder / "anchor", augments=augments, bridge=folder / "bridge" if (folder / "bridge").is_dir() else None,
        data_files=data_files, eval_files=eval_files, example_prompts=list(meta.get("example_prompts", [])),
        table=meta.get("table"), paper_table=meta.get("paper_table"),
        max_new_tokens=int(meta.get("max_new_tokens", 16)), prompt_mode=meta.get("prompt_mode", "completion"),
        eval_max_new_tokens=meta.get("eval_max_new_tokens"), eval_scoring=dict(meta.get("eval_scoring") or {}),
        eval_table_rows=dict(meta.get("eval_table_rows") or {}), protocol=meta.get("protocol", ""),
        **{k: meta[k] for k in ("paper_table_title", "metrics") if meta.get(k)},
    )


def _number(value) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.1f}"
