"""Large CSV, Parquet and text files, read by `datasets`, as Arrow columns: rows and examples are made only
when one is needed, checks run on whole columns, a split is a list of row numbers, and a preview reads only
the first rows. A 40 MB CSV of 2.6 million rows is held in about 240 MB this way."""
from __future__ import annotations

import codecs
import csv
import io
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

from .examples import _MB, FORMATS, KEEP_ANCHOR_MEANING, DataError, Example, _kind

EXACT_SPLIT_ROWS = 1_000_000  # above this, a split is drawn by numpy (no list of every row number)
HEAD_ONLY_BYTES = 8 * _MB  # a larger CSV / text / Parquet file is previewed from its first rows only


def check_utf8(p: Path, name: str, block: int = 4 * _MB) -> str:
    """Check a whole file is UTF-8 block by block (never all in memory); returns its first block's text."""
    decoder, head, offset, lines = codecs.getincrementaldecoder("utf-8")(), None, 0, 0
    with open(p, "rb") as f:
        while True:
            data = f.read(block)
            if head is None and data.startswith(codecs.BOM_UTF8):
                data, offset = data[len(codecs.BOM_UTF8):], len(codecs.BOM_UTF8)
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError as exc:
                bad, line = offset + exc.start, lines + data.count(b"\n", 0, exc.start) + 1
                raise DataError(f"{name}: line {line} (byte offset {bad}) is not "
                                f"valid UTF-8 (byte 0x{data[exc.start]:02x}). Save the file as UTF-8.") from exc
            if head is None:
                head = text
            if not data:
                break
            offset, lines = offset + len(data), lines + data.count(b"\n")
    if not head.strip() and os.path.getsize(p) <= block:
        raise DataError(f"{name}: the file is empty.")
    return head


def _explain(exc: BaseException, name: str, kind: str) -> DataError:
    """Turn what pandas/pyarrow/datasets raised (the innermost cause) into a message about the file."""
    while exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        exc = exc.__cause__ or exc.__context__
    msg = str(exc).strip()
    if m := re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", msg):
        return DataError(f"{name}: malformed CSV at line {m[2]}: {m[3]} fields where the header has {m[1]}. "
                         "Put values that contain commas in double quotes.")
    if m := re.search(r"EOF inside string starting at row (\d+)", msg):  # pandas counts lines from 0 here
        return DataError(f"{name}: malformed CSV: the quoted value that starts on line {int(m[1]) + 1} "
                         "is never closed.")
    if "corresponds to no data" in msg:
        return DataError(f"{name}: the file has no rows.")
    return DataError(f"{name}: could not be read as {kind.upper()}: {msg}")


def read_with_datasets(p: Path, name: str, kind: str, text: str | None, table_class):
    """A CSV, Parquet or text file read by `datasets` offline, in memory, through a link with a plain name."""
    import datasets
    import pyarrow.parquet as pq

    options: dict = {"encoding": "utf-8-sig"}
    if kind == "csv":  # every column as text, exactly as written: no "08" -> 8, no "NA"/"None" -> null
        try:
            header = next((r for r in csv.reader(io.StringIO(text.split("\n", 1)[0])) if r), [])
        except csv.Error as exc:
            raise DataError(f"{name}: malformed CSV header: {exc}.") from exc
        if len(set(header)) != len(header) or not all(header):
            raise DataError(f"{name}: the header needs a distinct, non-empty name for every column; it is {header}.")
        options.update(features=datasets.Features({c: datasets.Value("string") for c in header}),
                       na_filter=False, keep_default_na=False)
    elif kind == "parquet":  # datasets fails on a 0-row file ("BatchSize must be greater than 0")
        try:
            n_rows = pq.read_metadata(p).num_rows
        except Exception as exc:
            raise DataError(f"{name}: not a readable Parquet file ({exc}).") from exc
        if n_rows == 0:
            raise DataError(f"{name}: the file has no rows.")
        options = {}
    with tempfile.TemporaryDirectory(prefix="calm-data-") as tmp:
        link = Path(tmp, "input", "data" + p.suffix.lower())
        link.parent.mkdir()
        try:
            os.symlink(p.resolve(), link)
        except OSError:
            shutil.copyfile(p, link)
        try:
            ds = datasets.load_dataset({"txt": "text"}.get(kind, kind), data_files=str(link), split="train",
                                       cache_dir=str(Path(tmp, "cache")), keep_in_memory=True, **options)
            arrow = ds.data.table
            del ds
        except Exception as exc:  # whatever the readers raise, the user gets a message about the file
            raise _explain(exc, name, kind) from exc
    return arrow_table(arrow, kind, table_class)


def arrow_table(arrow, kind: str, table_class):
    """The reader's Arrow table as the module's table: text files keep their non-empty lines."""
    lines = None
    if kind == "txt":  # one example per non-empty line
        import numpy as np
        import pyarrow.compute as pc

        keep = pc.not_equal(pc.utf8_trim_whitespace(arrow.column("text")), "")
        lines = np.flatnonzero(keep.to_numpy(zero_copy_only=False)) + 1
        arrow = arrow.filter(keep)
    arrow = arrow.combine_chunks()
    return table_class(list(arrow.column_names), ArrowRows(arrow), lines, arrow)


def longest_examples(examples, k: int = 4) -> list[Example]:
    """The k examples with the most characters (prompt and completion together)."""
    if isinstance(examples, ArrowExamples):
        return examples.longest(k)
    import heapq

    return heapq.nlargest(k, examples, key=lambda e: len(e.prompt) + len(e.completion))


class ArrowRows:
    """Rows of an Arrow table as dicts, made only when asked for."""

    def __init__(self, arrow):
        self.arrow = arrow

    def __len__(self) -> int:
        return self.arrow.num_rows

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            rows = self.arrow.slice(start, max(0, stop - start)).to_pylist()
            return rows[::step]
        return self.arrow.slice(index, 1).to_pylist()[0]


class ArrowExamples:
    """Examples read from Arrow columns on demand (optionally through a list of row numbers): a large
    file is never held as Python strings."""

    def __init__(self, prompts, completions, indices=None, keep=None):
        # keep: a numpy bool per file row (Example.keep_anchor), or None: no row is
        self.prompts, self.completions, self.indices, self.keep = prompts, completions, indices, keep

    def __len__(self) -> int:
        return len(self.completions) if self.indices is None else len(self.indices)

    def _example(self, i: int) -> Example:
        j = int(i if self.indices is None else self.indices[i])
        prompt = "" if self.prompts is None else self.prompts[j].as_py()
        return Example(prompt, self.completions[j].as_py(), self.keep is not None and bool(self.keep[j]))

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._example(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._example(index)

    def __iter__(self):
        return (self._example(i) for i in range(len(self)))

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (list, ArrowExamples)) else NotImplemented

    def longest(self, k: int) -> list[Example]:
        """The k examples with the most characters, found on the Arrow columns."""
        import numpy as np
        import pyarrow.compute as pc

        lengths = pc.utf8_length(self.completions).to_numpy(zero_copy_only=False).astype(np.int64)
        if self.prompts is not None:
            lengths += pc.utf8_length(self.prompts).to_numpy(zero_copy_only=False)
        if self.indices is not None:
            lengths = lengths[self.indices]
        k = min(k, len(lengths))
        top = np.argpartition(lengths, len(lengths) - k)[len(lengths) - k:] if k else []
        return [self._example(int(i)) for i in top]

    def split(self, n_val: int, seed: int) -> "tuple[ArrowExamples, ArrowExamples]":
        """(train, validation) views; below EXACT_SPLIT_ROWS the same split a list would get."""
        import numpy as np

        n = len(self)
        if n <= EXACT_SPLIT_ROWS:
            order = list(range(n))
            random.Random(seed).shuffle(order)
            held = np.sort(np.asarray(order[:n_val], dtype=np.int64))
        else:
            held = np.sort(np.random.default_rng(seed).permutation(n)[:n_val])
        keep = np.ones(n, dtype=bool)
        keep[held] = False
        return self.take(np.flatnonzero(keep)), self.take(held)

    def take(self, indices) -> "ArrowExamples":
        """A view of these rows, in the order given (row numbers of this view)."""
        import numpy as np

        indices = np.asarray(indices, dtype=np.int64)
        return ArrowExamples(self.prompts, self.completions, indices if self.indices is None else self.indices[indices],
                             self.keep)

    def kept(self) -> int:
        """How many of these rows are trained toward the anchor alone, counted on the column."""
        if self.keep is None:
            return 0
        return int(self.keep.sum() if self.indices is None else self.keep[self.indices].sum())


def check_columns(table, name: str, roles: dict[str, str]) -> None:
    """The checks of _check_rows on Arrow columns, without making a row: the first bad row is named."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for role, column in roles.items():
        values = table.arrow.column(column)
        if values.null_count:
            i = pc.index(pc.is_null(values), True).as_py()
            raise DataError(f"{name}: {table.where(i)} has no value in column {column!r} (missing or null); "
                            f"every row needs a {role}.")
        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            value = values[0].as_py()
            raise DataError(f"{name}: {table.where(0)}, column {column!r}: expected a string, got a {_kind(value)} "
                            f"({str(value)[:40]}). Values are not converted (8.0 and \"8\" would teach different "
                            "answers): write it as a string in the file.")
        if role != "prompt" and pc.any(pc.equal(values, "")).as_py():
            i = pc.index(pc.equal(values, ""), True).as_py()
            raise DataError(f"{name}: {table.where(i)}, column {column!r} is empty: nothing to learn from that "
                            "row. Fill it in or remove the row.")


def keep_anchor_flags(table, name: str, column: str):
    """The keep_anchor column as a numpy bool per row: a boolean column (null: false), or text that reads
    true / false (any case; empty: false), as a CSV file has it."""
    import pyarrow as pa
    import pyarrow.compute as pc


    values = table.arrow.column(column)
    if pa.types.is_boolean(values.type):
        return values.fill_null(False).to_numpy(zero_copy_only=False)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        words = pc.utf8_lower(pc.utf8_trim_whitespace(values.fill_null("")))
        bad = pc.invert(pc.is_in(words, value_set=pa.array(["true", "false", ""])))
        if pc.any(bad).as_py():
            i = pc.index(bad, True).as_py()
            raise DataError(f"{name}: {table.where(i)}, column {column!r}: expected true or false, got "
                            f"{values[i].as_py()[:40]!r}. {KEEP_ANCHOR_MEANING}")
        return pc.equal(words, "true").to_numpy(zero_copy_only=False)
    raise DataError(f"{name}: column {column!r} holds {values.type} values; expected true or false. "
                    f"{KEEP_ANCHOR_MEANING}")


def preview_head(p: Path, n: int) -> list[dict] | None:
    """The first n rows of a large CSV, text or Parquet file without reading the rest (None: read it all)."""
    kind = FORMATS.get(p.suffix.lower())
    if kind not in ("csv", "txt", "parquet") or not p.is_file() or p.stat().st_size <= HEAD_ONLY_BYTES:
        return None
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            batch = next(pq.ParquetFile(p).iter_batches(batch_size=n), None)
        except Exception as exc:
            raise DataError(f"{p.name}: not a readable Parquet file ({exc}).") from exc
        return batch.to_pylist() if batch is not None else []
    with open(p, "rb") as f:
        data = f.read(1 * _MB)
    text = data.decode("utf-8-sig", errors="replace").rsplit("\n", 1)[0]  # whole lines only
    if kind == "txt":
        return [{"text": line} for line in text.split("\n") if line.strip()][:n]
    rows = list(csv.reader(io.StringIO(text)))
    header, body = rows[0], [r for r in rows[1:] if r][:n]
    return [dict(zip(header, r + [None] * (len(header) - len(r)))) for r in body]
