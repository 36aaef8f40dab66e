"""Presets: a trained model pair, its bridge and its data sets, shipped in the repository so that
the app starts offline with something that works.

Layout of presets/<name>/: anchor/ and augment/ (save_pretrained model + tokenizer), bridge/
(ComposedLM.save_pretrained), data/*.jsonl, and preset.json with at least a title and a
description; optional: example_prompts, eval_files {label: path}, table, paper_table,
max_new_tokens, prompt_mode ("completion" or "chat"), paper_table_title, metrics (the
evaluation metrics that suit the preset's data, e.g. ["chrf", "bleu"] for translation)."""
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
        return f"### {self.paper_table_title}\n" + "\n".join(lines)



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
        **{k: meta[k] for k in ("paper_table_title", "metrics") if meta.get(k)},
    )


def _number(value) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.1f}"
