"""Composition data sets from one uploaded file: .csv, .jsonl, .json, .parquet or .txt.

CSV, Parquet and text are read by Hugging Face `datasets`, offline and into memory, with a
throwaway cache (a changed file is always read afresh) and through a link with a plain name
(`datasets` treats `[`, `*` and `?` in a path as a glob: `a[1].csv` would read `a1.csv`).
JSON and JSON Lines are parsed with Python's `json`: pyarrow fills records of another shape
with nulls and turns a column holding both "8" and 8 into numbers, so the row, column and
type that a message must name only survive in the records as written.

Every problem with a file is a DataError naming the file, and the row and column where that
applies; nothing from datasets, pyarrow or pandas reaches the caller.
"""
from __future__ import annotations

import codecs
import json
import random
from dataclasses import dataclass
from pathlib import Path

from .data_arrow import (  # noqa: F401
    ArrowExamples,
    check_columns,
    check_utf8,
    keep_anchor_flags,
    longest_examples,
    preview_head,
    read_with_datasets,
)
from .examples import _MB, FORMATS, KEEP_ANCHOR_MEANING, ROLES, DataError, Example, _kind  # noqa: F401


@dataclass
class DataConfig:
    text_column: str = "text"
    prompt_column: str = "prompt"
    completion_column: str = "completion"
    column_map: dict[str, str] | None = None  # file column -> role; overrides the *_column names
    # optional: rows with true here are trained toward the anchor alone (Example.keep_anchor); absent: none are
    keep_anchor_column: str = "keep_anchor"
    validation_fraction: float = 0.1  # used when no separate validation file is given
    seed: int = 0
    max_file_bytes: int = 200 * _MB  # uploads over this are refused before reading


@dataclass
class DataSplits:
    train: list[Example]
    validation: list[Example]
    shape: str  # "text" or "prompt_completion"
    columns: list[str]  # the (training) file's own column names
    source: str  # file name(s), for messages and run records

    @property
    def kept(self) -> int:
        """How many training examples are trained toward the anchor alone (Example.keep_anchor)."""
        if isinstance(self.train, ArrowExamples):
            return self.train.kept()
        return sum(e.keep_anchor for e in self.train)


@dataclass
class _Table:
    """Rows as read, before any check; `lines[i]` is the file line of row i where the two differ.
    CSV, Parquet and text stay Arrow columns (`arrow`), read as rows only where a row is needed."""

    columns: list[str]
    rows: list  # dicts, or data_arrow.ArrowRows made one at a time
    lines: list[int] | None = None
    arrow: object = None

    def where(self, i: int) -> str:
        line = f" (line {self.lines[i]})" if self.lines and self.lines[i] != i + 1 else ""
        return f"row {i + 1}{line}"


def _columns(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(k for row in rows for k in row))


def _decode(data: bytes, name: str) -> str:
    """UTF-8 (a leading BOM is dropped); a bad byte is reported by line and byte offset."""
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = start + exc.start
        line = data.count(b"\n", 0, offset) + 1
        raise DataError(f"{name}: line {line} (byte offset {offset}) is not valid UTF-8 "
                        f"(byte 0x{data[offset]:02x}). Save the file as UTF-8.") from exc
    if not text.strip():
        raise DataError(f"{name}: the file is empty.")
    return text


def _read_jsonl(text: str, name: str) -> _Table:
    rows, lines = [], []
    for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines(): JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{name}: line {lineno} is not valid JSON ({exc.msg} at column {exc.colno}). "
                            "Each line must hold one complete JSON object.") from exc
        if not isinstance(record, dict):
            hint = " If the file is one JSON array, name it .json." if isinstance(record, list) else ""
            raise DataError(f"{name}: line {lineno} is a JSON {_kind(record)}, not an object "
                            f'like {{"prompt": ..., "completion": ...}}.{hint}')
        rows.append(record)
        lines.append(lineno)
    return _Table(_columns(rows), rows, lines)


def _read_json(text: str, name: str) -> _Table:
    """A list of records or of strings, {"data": [records], ...}, or {column: [values]}."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{name}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}. "
                        "(For one object per line, name the file .jsonl.)") from exc
    records = None
    if isinstance(data, list):
        records = [{"text": x} for x in data] if data and all(isinstance(x, str) for x in data) else data
    elif isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if len(lists) == 1:  # {"data": [records], "version": ...}, or a single column
            key, records = next(iter(lists.items()))
            if not any(isinstance(x, dict) for x in records):
                records = [{key: x} for x in records] if len(data) == 1 else None
        elif lists and len(lists) == len(data):  # {column: [values]}
            if len({len(v) for v in lists.values()}) > 1:
                lengths = {k: len(v) for k, v in lists.items()}
                raise DataError(f"{name}: the columns have different lengths: {lengths}.")
            records = [dict(zip(data, values)) for values in zip(*data.values())]
    if records is None:
        raise DataError(f'{name}: expected a JSON list of records, {{"data": [records]}} or {{column: [values]}}; '
                        f"found a JSON {_kind(data)}.")
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise DataError(f"{name}: row {i + 1} is a JSON {_kind(record)}, not an object.")
    return _Table(_columns(records), records)


def _read(path, config: DataConfig) -> tuple[_Table, str, str]:
    p = Path(path)
    name = p.name or str(p)
    kind = FORMATS.get(p.suffix.lower())
    if not p.exists():
        raise DataError(f"{name}: file not found ({p}).")
    if not p.is_file():
        raise DataError(f"{name}: is not a file ({p}).")
    if kind is None:
        raise DataError(f"{name}: unsupported file type {p.suffix or '(no extension)'!r}; "
                        f"supported: {', '.join(FORMATS)}.")
    size = p.stat().st_size
    if size > config.max_file_bytes:
        raise DataError(f"{name}: the file is {size / _MB:.3g} MB, over the {config.max_file_bytes / _MB:.3g} MB "
                        "limit (DataConfig.max_file_bytes). Upload a smaller sample.")
    if size == 0:
        raise DataError(f"{name}: the file is empty.")
    if kind == "parquet":
        text = None
    elif kind in ("csv", "txt"):  # read by Arrow; only checked here, block by block
        text = check_utf8(p, name)
    else:
        text = _decode(p.read_bytes(), name)
    reader = {"jsonl": _read_jsonl, "json": _read_json}.get(kind)
    table = reader(text, name) if reader else read_with_datasets(p, name, kind, text, _Table)
    if not table.rows:
        raise DataError(f"{name}: the file has no rows" + (" (only a header)." if kind == "csv" else "."))
    return table, name, kind


def _roles(columns: list[str], name: str, config: DataConfig) -> tuple[dict[str, str], str, dict[str, str]]:
    """(role -> file column used, shape, role -> column looked for)."""
    wanted = {"text": config.text_column, "prompt": config.prompt_column, "completion": config.completion_column}
    mapped: dict[str, str] = {}
    for column, role in (config.column_map or {}).items():
        if role not in ROLES:
            raise DataError(f"{name}: column_map maps {column!r} to unknown role {role!r}; "
                            "the roles are 'text', 'prompt' and 'completion'.")
        if column not in columns:
            raise DataError(f"{name}: column_map names column {column!r}, which the file lacks; "
                            f"its columns are {columns}.")
        if role in mapped:
            raise DataError(f"{name}: column_map maps both {mapped[role]!r} and {column!r} to {role!r}.")
        mapped[role] = column
    wanted.update(mapped)
    have = {role: col for role, col in wanted.items() if col in columns}
    if "prompt" in have and "completion" in have:  # preferred when a `text` column is there too
        return {"prompt": have["prompt"], "completion": have["completion"]}, "prompt_completion", wanted
    if "text" in have:
        return {"text": have["text"]}, "text", wanted
    spare = [c for c in columns if c not in have.values()] or ["your_column"]
    if "prompt" in have or "completion" in have:
        role, missing = ("prompt", "completion") if "prompt" in have else ("completion", "prompt")
        need, example = f"a {wanted[missing]!r} column to go with {have[role]!r}", {spare[0]: missing}
    else:
        need = f"a {wanted['text']!r} column, or {wanted['prompt']!r} and {wanted['completion']!r} columns"
        example = dict(zip(spare, ("prompt", "completion"))) if len(spare) >= 2 else {spare[0]: "text"}
    sep = next((c for c in ";\t|" if len(columns) == 1 and c in columns[0]), None)
    hint = f" The header looks separated by {sep!r}: save the file with commas." if sep else ""
    raise DataError(f"{name}: the file has columns {columns} but needs {need}. If yours are named differently, "
                    f"map them to roles: {example} (the column choices in the app, --column-map in the CLI, "
                    f"DataConfig.column_map in Python).{hint}")


def _check_rows(table: _Table, name: str, roles: dict[str, str], wanted: dict[str, str]) -> None:
    """One shape in every (JSON) record, and a string in each role: non-empty except the prompt."""
    def shape(row):
        if wanted.get("prompt") in row or wanted.get("completion") in row:
            return "'prompt'/'completion'"
        return "'text'" if wanted["text"] in row else None

    shapes = [shape(row) for row in table.rows]
    first = next((i for i, s in enumerate(shapes) if s), None)
    for i, s in enumerate(shapes):
        if s and s != shapes[first]:
            raise DataError(f"{name}: mixed shapes: {table.where(i)} has {s} but {table.where(first)} has "
                            f"{shapes[first]}. Use one shape for every row.")
    for i, row in enumerate(table.rows):
        for role, column in roles.items():
            value = row.get(column)
            if value is None:
                raise DataError(f"{name}: {table.where(i)} has no value in column {column!r} (missing or null); "
                                f"every row needs a {role}.")
            if not isinstance(value, str):
                raise DataError(f"{name}: {table.where(i)}, column {column!r}: expected a string, got a {_kind(value)} "
                                f"({str(value)[:40]}). Values are not converted (8.0 and \"8\" would teach different "
                                "answers): write it as a string in the file.")
            if not value and role != "prompt":
                raise DataError(f"{name}: {table.where(i)}, column {column!r} is empty: nothing to learn from that "
                                "row. Fill it in or remove the row.")


def _load(path, config: DataConfig) -> tuple[_Table, dict[str, str], str]:
    table, name, kind = _read(path, config)
    if kind == "txt":  # always one `text` column, whatever the config names
        roles, shape, wanted = {"text": "text"}, "text", {"text": "text"}
    else:
        roles, shape, wanted = _roles(table.columns, name, config)
    if table.arrow is not None:
        check_columns(table, name, roles)
    else:
        _check_rows(table, name, roles, wanted)
    return table, roles, shape


def load_examples(path, config: DataConfig | None = None) -> tuple[list[Example], str, list[str]]:
    """(examples, shape, the file's columns); any problem with the file is a DataError."""
    config = config or DataConfig()
    table, roles, shape = _load(path, config)
    keep = config.keep_anchor_column if config.keep_anchor_column in table.columns else None
    if table.arrow is not None:
        column = table.arrow.column
        flags = keep_anchor_flags(table, Path(path).name, keep) if keep else None
        if shape == "text":
            return ArrowExamples(None, column(roles["text"]), keep=flags), shape, table.columns
        return ArrowExamples(column(roles["prompt"]), column(roles["completion"]), keep=flags), shape, table.columns
    flags = _keep_anchor_rows(table, Path(path).name, keep) if keep else [False] * len(table.rows)
    if shape == "text":
        return [Example("", row[roles["text"]], f) for row, f in zip(table.rows, flags)], shape, table.columns
    return ([Example(row[roles["prompt"]], row[roles["completion"]], f) for row, f in zip(table.rows, flags)],
            shape, table.columns)


def _keep_anchor_rows(table: _Table, name: str, column: str) -> list[bool]:
    """A JSON record's keep_anchor value: true or false (absent or null: false); nothing else is converted."""
    flags = []
    for i, row in enumerate(table.rows):
        value = row.get(column)
        if value is not None and not isinstance(value, bool):
            raise DataError(f"{name}: {table.where(i)}, column {column!r}: expected true or false, got a "
                            f"{_kind(value)} ({str(value)[:40]}). {KEEP_ANCHOR_MEANING}")
        flags.append(bool(value))
    return flags


def _split(examples: list[Example], config: DataConfig) -> tuple[list[Example], list[Example]]:
    """Seeded random split; both parts keep file order. At least 1 validation example when n >= 2."""
    fraction, n = config.validation_fraction, len(examples)
    n_val = 0 if fraction == 0 or n < 2 else min(n - 1, max(1, round(n * fraction)))
    if isinstance(examples, ArrowExamples):  # row numbers only, never the rows
        return examples.split(n_val, config.seed)
    order = list(range(n))
    random.Random(config.seed).shuffle(order)
    held = set(order[:n_val])
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def load_splits(train_path, validation_path=None, config: DataConfig | None = None) -> DataSplits:
    """Train/validation examples: from two files (same config, same shape), or one file split by seed."""
    config = config or DataConfig()
    name = Path(train_path).name
    if validation_path is None and not 0 <= config.validation_fraction < 1:
        raise DataError(f"{name}: validation_fraction must be at least 0 and below 1, "
                        f"got {config.validation_fraction}.")
    train, shape, columns = load_examples(train_path, config)
    if validation_path is None:
        return DataSplits(*_split(train, config), shape, columns, name)
    validation, val_shape, _ = load_examples(validation_path, config)
    val_name = Path(validation_path).name
    if val_shape != shape:
        raise DataError(f"{name} has {shape} rows but the validation file {val_name} has {val_shape} rows; "
                        "both files need the same shape.")
    return DataSplits(train, validation, shape, columns, f"{name} + {val_name}")


def preview(path, n: int = 5, config: DataConfig | None = None, check_roles: bool = True) -> list[dict]:
    """The first n rows with the file's own columns (absent JSON keys as None), after every check.
    check_roles=False only reads the file: for choosing a column mapping before there is one."""
    config = config or DataConfig()
    if not check_roles and (head := preview_head(Path(path), n)) is not None:
        return head
    table = _load(path, config)[0] if check_roles else _read(path, config)[0]
    return [{c: row.get(c) for c in table.columns} for row in table.rows[:n]]
