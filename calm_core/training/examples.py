"""What one row of composition data is (Example), the formats a file may come in, and the error that names a bad one.
data.py (small files) and data_arrow.py (large ones, as Arrow columns) both build on these."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..errors import CALMError

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".txt": "txt"}
ROLES = ("text", "prompt", "completion")
_MB = 1024 * 1024


class DataError(CALMError):
    """A data file cannot be used; the message names the file (row, column) and the fix."""


@dataclass(frozen=True)
class Example:
    prompt: str  # context; no loss on it ("" for plain-text rows)
    completion: str  # the loss is on these characters (the whole text for `text` rows)
    # True: the completion's tokens are trained toward the anchor alone's next-token distribution (KL), not
    # toward the text: rehearsal rows that teach the bridge to leave the anchor as it was where m_A adds nothing
    keep_anchor: bool = False


def write_jsonl(path, examples) -> None:
    """Examples as JSON lines (prompt, completion, keep_anchor): the rows a recipe added to a run, kept beside it."""
    Path(path).write_text("".join(json.dumps(asdict(e)) + "\n" for e in examples))


def read_jsonl(path) -> list[Example]:
    """The rows write_jsonl wrote (none when the file is absent or empty)."""
    path, names = Path(path), {f.name for f in fields(Example)}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return [Example(**{k: v for k, v in row.items() if k in names}) for row in rows]


def _kind(value) -> str:
    """The JSON name of a value's type, for messages."""
    names = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "list",
             dict: "object"}
    return names.get(type(value), type(value).__name__)


KEEP_ANCHOR_MEANING = ("A row with keep_anchor true is trained toward the anchor alone's own next-token "
                       "distribution (a rehearsal row that keeps the anchor as it was), not toward its text.")
