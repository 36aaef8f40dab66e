"""calm_core.training.data: every format and shape, the split, and a DataError naming file/row/column for bad input."""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from calm_core.errors import CALMError
from calm_core.training.data import DataConfig, DataError, DataSplits, Example, load_examples, load_splits, preview

PC = [{"prompt": "12+30=", "completion": "42"}, {"prompt": "", "completion": "08"},
      {"prompt": "naïve, \"café\"\nline two", "completion": " None"}]
PC_EX = [Example(r["prompt"], r["completion"]) for r in PC]
TEXT = ["the quick brown fox", "NA", "  déjà vu, 12 + 30 = 42"]
TEXT_EX = [Example("", t) for t in TEXT]


def csv_of(rows, columns):
    def cell(v):
        return '"' + v.replace('"', '""') + '"' if any(c in v for c in ',"\n') else v
    return ",".join(columns) + "\n" + "".join(",".join(cell(r[c]) for c in columns) + "\n" for r in rows)


def jsonl_of(rows):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def write(path, content):
    """str/bytes are written as is; a dict of columns becomes a Parquet table."""
    if isinstance(content, dict):
        pq.write_table(pa.table(content), path)
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def columns_of(rows):
    return {k: [r[k] for r in rows] for k in rows[0]}


TEXT_ROWS = [{"text": t} for t in TEXT]
GOOD = [
    ("pc.csv", csv_of(PC, ["prompt", "completion"]), None, PC_EX, "prompt_completion"),
    ("text.csv", csv_of(TEXT_ROWS, ["text"]), None, TEXT_EX, "text"),
    ("bom.csv", b"\xef\xbb\xbf" + csv_of(PC, ["prompt", "completion"]).encode(), None, PC_EX, "prompt_completion"),
    ("crlf.csv", "prompt,completion\r\na,b\r\n", None, [Example("a", "b")], "prompt_completion"),
    ("pc.jsonl", jsonl_of(PC), None, PC_EX, "prompt_completion"),
    ("text.jsonl", "\n" + jsonl_of(TEXT_ROWS) + "\n\n", None, TEXT_EX, "text"),
    ("pc.json", json.dumps(PC), None, PC_EX, "prompt_completion"),
    ("text.json", json.dumps(TEXT_ROWS), None, TEXT_EX, "text"),
    ("strings.json", json.dumps(TEXT), None, TEXT_EX, "text"),
    ("field.json", json.dumps({"version": "1", "data": PC}), None, PC_EX, "prompt_completion"),
    ("columns.json", json.dumps(columns_of(PC)), None, PC_EX, "prompt_completion"),
    ("pc.parquet", columns_of(PC), None, PC_EX, "prompt_completion"),
    ("text.parquet", columns_of(TEXT_ROWS), None, TEXT_EX, "text"),
    ("lines.txt", "\ufeff" + TEXT[0] + "\r\n\n  \n" + "\n".join(TEXT[1:]) + "\n", None, TEXT_EX, "text"),
    ("UPPER.JSONL", jsonl_of(PC), None, PC_EX, "prompt_completion"),
    # values are text exactly as written: no "08" -> 8, no "NA" -> null
    ("numbers.csv", "prompt,completion\n1+7=,08\n0.5*2=,1.0\nx,NA\n", None,
     [Example("1+7=", "08"), Example("0.5*2=", "1.0"), Example("x", "NA")], "prompt_completion"),
    # mapping, renamed roles, preference and extra columns
    ("mapped.csv", csv_of([{"source": "a", "target": "b"}], ["source", "target"]),
     DataConfig(column_map={"source": "prompt", "target": "completion"}), [Example("a", "b")], "prompt_completion"),
    ("mapped.jsonl", jsonl_of([{"q": "a", "a": "b", "prompt": "unused"}]),
     DataConfig(column_map={"q": "prompt", "a": "completion"}), [Example("a", "b")], "prompt_completion"),
    ("mapped.parquet", {"body": ["x", "y"]}, DataConfig(column_map={"body": "text"}),
     [Example("", "x"), Example("", "y")], "text"),
    ("renamed.jsonl", jsonl_of([{"question": "a", "answer": "b"}]),
     DataConfig(prompt_column="question", completion_column="answer"), [Example("a", "b")], "prompt_completion"),
    ("both.jsonl", jsonl_of([{"text": "t", "prompt": "a", "completion": "b", "id": 1}]), None,
     [Example("a", "b")], "prompt_completion"),
    ("extra.csv", "id,text,score\n1,hello,0.5\n", None, [Example("", "hello")], "text"),
    ("odd[1].csv", "text\nmine\n", None, [Example("", "mine")], "text"),  # not a glob for odd1.csv
]


@pytest.mark.parametrize("name, content, config, expected, shape", GOOD, ids=[g[0] for g in GOOD])
def test_reads_every_format_and_shape(tmp_path, name, content, config, expected, shape):
    write(tmp_path / "odd1.csv", "text\nsomeone else's\n")
    examples, got_shape, columns = load_examples(write(tmp_path / name, content), config or DataConfig())
    assert examples == expected and got_shape == shape
    assert all(isinstance(c, str) for c in columns) and columns


@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet", "txt"])
def test_reads_the_new_content_after_the_file_changed(tmp_path, ext):
    path = tmp_path / f"data.{ext}"
    for word in ("aaaa", "bbbb"):  # same size, possibly the same mtime: no stale cache
        content = {"csv": f"text\n{word}\n", "jsonl": jsonl_of([{"text": word}]), "txt": word + "\n",
                   "parquet": {"text": [word]}}[ext]
        write(path, content)
        assert load_examples(path)[0] == [Example("", word)]


def test_preview_shows_the_files_own_columns(tmp_path):
    path = write(tmp_path / "p.jsonl", jsonl_of([{"q": "a", "a": "b"}, {"q": "c", "a": "d", "n": 1}, {"q": "e", "a": "f"}]))
    config = DataConfig(column_map={"q": "prompt", "a": "completion"})
    assert preview(path, 2, config) == [{"q": "a", "a": "b", "n": None}, {"q": "c", "a": "d", "n": 1}]
    with pytest.raises(DataError, match="column_map"):
        preview(path)


def numbered(n):
    return jsonl_of([{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(n)])


@pytest.mark.parametrize("n, fraction, n_val", [(20, 0.1, 2), (20, 0.25, 5), (10, 0.01, 1), (2, 0.1, 1),
                                                 (3, 0.9, 2), (1, 0.1, 0), (20, 0.0, 0)])
def test_split_sizes(tmp_path, n, fraction, n_val):
    splits = load_splits(write(tmp_path / "d.jsonl", numbered(n)), config=DataConfig(validation_fraction=fraction))
    assert isinstance(splits, DataSplits) and len(splits.validation) == n_val
    assert sorted(splits.train + splits.validation, key=lambda e: int(e.prompt[1:])) == load_examples(tmp_path / "d.jsonl")[0]
    assert splits.shape == "prompt_completion" and splits.columns == ["prompt", "completion"] and splits.source == "d.jsonl"


def test_split_is_seeded(tmp_path):
    path = write(tmp_path / "d.jsonl", numbered(30))
    split = {seed: load_splits(path, config=DataConfig(seed=seed, validation_fraction=0.2)) for seed in (0, 1)}
    again = load_splits(path, config=DataConfig(seed=0, validation_fraction=0.2))
    assert (again.train, again.validation) == (split[0].train, split[0].validation)
    assert split[0].validation != split[1].validation
    for s in split.values():
        assert not set(s.train) & set(s.validation) and len(s.train) + len(s.validation) == 30


def test_separate_validation_file(tmp_path):
    train = write(tmp_path / "train.csv", csv_of(PC, ["prompt", "completion"]))
    val = write(tmp_path / "val.jsonl", jsonl_of(PC[:1]))
    splits = load_splits(train, val, DataConfig(validation_fraction=0.5))
    assert (splits.train, splits.validation, splits.source) == (PC_EX, PC_EX[:1], "train.csv + val.jsonl")
    with pytest.raises(DataError, match=r"train\.csv.*val\.txt.*same shape"):
        load_splits(train, write(tmp_path / "val.txt", "one line\n"))
    with pytest.raises(DataError, match=r"missing\.csv"):
        load_splits(train, tmp_path / "missing.csv")


def test_bad_validation_fraction(tmp_path):
    with pytest.raises(DataError, match="validation_fraction"):
        load_splits(write(tmp_path / "d.jsonl", numbered(4)), config=DataConfig(validation_fraction=1.0))


LATIN1 = "prompt,completion\na,b\ncaf\xe9,x\n".encode("latin-1")
MAP = DataConfig(column_map={"source": "prompt", "target": "completion"})
BAD = [
    # the file itself
    ("none.csv", None, None, ["not found"]),
    ("big.csv", "text\n" + "x" * 100 + "\n", DataConfig(max_file_bytes=10), ["MB", "limit", "max_file_bytes"]),
    ("data.xlsx", "x", None, ["unsupported", ".xlsx", ".csv, .jsonl, .json, .parquet, .txt"]),
    ("data", "x", None, ["unsupported", "no extension"]),
    ("empty.csv", "", None, ["empty"]),
    ("empty.jsonl", "\n \n", None, ["empty"]),
    ("empty.txt", "\n\n", None, ["empty"]),
    ("header.csv", "prompt,completion\n", None, ["no rows"]),
    ("none.json", "[]", None, ["no rows"]),
    ("none.parquet", {"text": pa.array([], pa.string())}, None, ["no rows"]),
    # bytes that are not UTF-8
    ("latin.csv", LATIN1, None, ["line 3", "UTF-8", "byte offset 25"]),
    ("latin.jsonl", b'{"text": "a"}\n{"text": "caf\xe9"}\n', None, ["line 2", "UTF-8"]),
    ("latin.txt", b"ok\n\xff\n", None, ["line 2", "UTF-8"]),
    # columns
    ("cols.csv", "source,target\na,b\n", None,
     ["['source', 'target']", "'text'", "'prompt'", "'completion'", "map them to roles: {'source': 'prompt', 'target': 'completion'}"]),
    ("half.jsonl", jsonl_of([{"prompt": "a", "answer": "b"}]), None, ["'completion'", "'prompt'", "map them to roles: {'answer': 'completion'}"]),
    ("semicolon.csv", "prompt;completion\na;b\n", None, ["['prompt;completion']", "separated by ';'"]),
    ("lacks.csv", "src,target\na,b\n", MAP, ["column_map", "'source'", "['src', 'target']"]),
    ("role.csv", "source,target\na,b\n", DataConfig(column_map={"source": "question", "target": "completion"}),
     ["unknown role 'question'", "'text'"]),
    ("twice.csv", "source,target\na,b\n", DataConfig(column_map={"source": "prompt", "target": "prompt"}), ["both"]),
    ("dupe.csv", "prompt,prompt\na,b\n", None, ["header", "['prompt', 'prompt']"]),
    # types: never converted
    ("int.jsonl", jsonl_of(PC[:2] + [{"prompt": "1+1=", "completion": 2}]), None, ["row 3", "'completion'", "number"]),
    ("float.jsonl", jsonl_of([{"text": "a"}, {"text": 8.0}]), None, ["row 2", "'text'", "number", "8.0"]),
    ("list.json", json.dumps([{"prompt": ["a"], "completion": "b"}]), None, ["row 1", "'prompt'", "list"]),
    ("dict.jsonl", jsonl_of([{"prompt": "a", "completion": {"x": 1}}]), None, ["row 1", "'completion'", "object"]),
    ("bool.json", json.dumps({"text": ["a", True]}), None, ["row 2", "'text'", "boolean"]),
    ("int.parquet", {"prompt": ["a", "b"], "completion": [1, 2]}, None, ["row 1", "'completion'", "number"]),
    ("mixed.jsonl", jsonl_of([{"text": "8"}, {"text": 8}]), None, ["row 2", "'text'", "number"]),
    # missing values
    ("null.jsonl", jsonl_of([PC[0], {"prompt": None, "completion": "b"}]), None, ["row 2", "'prompt'", "null"]),
    ("absent.jsonl", jsonl_of([PC[0], PC[1], {"completion": "b"}]), None, ["row 3", "'prompt'", "missing"]),
    ("null.parquet", {"text": ["a", None]}, None, ["row 2", "'text'", "null"]),
    ("blank.csv", "prompt,completion\na,b\nc,\n", None, ["row 2", "'completion'", "empty"]),
    ("short.csv", "text\na\n\"\"\n", None, ["row 2", "'text'", "empty"]),
    ("gaps.jsonl", '{"text": "a"}\n\n\n{"text": null}\n', None, ["row 2 (line 4)", "'text'"]),
    # mixed shapes
    ("shapes.jsonl", jsonl_of(PC[:2] + [{"text": "t"}]), None, ["mixed", "row 3", "'text'", "row 1"]),
    ("shapes2.jsonl", jsonl_of([{"text": "t"}, {"text": "u"}, {"prompt": "p", "completion": "c"}]), None,
     ["mixed", "row 3", "'prompt'/'completion'"]),
    ("shapes.json", json.dumps([{"text": "t"}, {"prompt": "p"}]), None, ["mixed", "row 2"]),
    # malformed files
    ("broken.jsonl", '{"text": "a"}\n{"text": "b"\n{"text": "c"}\n', None, ["line 2", "not valid JSON"]),
    ("array.jsonl", json.dumps(PC), None, ["line 1", "list", ".json"]),
    ("broken.json", '[\n {"text": "a"},\n {"text": }\n]', None, ["line 3", "not valid JSON"]),
    ("scalar.json", '"just text"', None, ["expected a JSON list"]),
    ("items.json", json.dumps([{"text": "a"}, "b"]), None, ["row 2", "string", "not an object"]),
    ("fields.csv", "prompt,completion\na,b\nc,d,e\n", None, ["line 3", "3 fields", "header has 2"]),
    ("quote.csv", 'prompt,completion\na,b\n"c,d\ne,f\n', None, ["line 3", "never closed"]),
    ("fake.parquet", "not parquet at all", None, ["Parquet"]),
]


@pytest.mark.parametrize("name, content, config, needles", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_clear_data_error(tmp_path, name, content, config, needles):
    path = tmp_path / name if content is None else write(tmp_path / name, content)
    with pytest.raises(DataError) as info:
        load_examples(path, config or DataConfig())
    message = str(info.value)
    assert isinstance(info.value, CALMError) and name in message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_directory_is_not_a_file(tmp_path):
    os.mkdir(tmp_path / "dir.csv")
    with pytest.raises(DataError, match=r"dir\.csv.*not a file"):
        load_examples(tmp_path / "dir.csv")


def test_a_large_file_is_previewed_from_its_first_rows(tmp_path, monkeypatch):
    import calm_core.training.data as data
    import calm_core.training.data_arrow as data_arrow

    path = write(tmp_path / "big.csv", "prompt,completion\n" + "".join(f'"a,{i}=",{i}\n' for i in range(2000)))
    whole = data.preview(path, n=8, check_roles=False)
    monkeypatch.setattr(data_arrow, "HEAD_ONLY_BYTES", 100)
    assert data.preview(path, n=8, check_roles=False) == whole
    txt = write(tmp_path / "big.txt", "".join(f"line {i}\n\n" for i in range(2000)))
    assert data.preview(txt, n=3, check_roles=False) == [{"text": f"line {i}"} for i in range(3)]


# keep_anchor: rehearsal rows trained toward the anchor alone (Example.keep_anchor), in every format that has columns
KEPT = [Example("a", "b", True), Example("c", "d", False), Example("e", "f", False)]
KEEP_GOOD = [
    ("keep.jsonl", jsonl_of([{"prompt": "a", "completion": "b", "keep_anchor": True},
                             {"prompt": "c", "completion": "d", "keep_anchor": False},
                             {"prompt": "e", "completion": "f"}]), KEPT),  # absent: false
    ("keep.json", json.dumps([{"prompt": "a", "completion": "b", "keep_anchor": True},
                              {"prompt": "c", "completion": "d", "keep_anchor": None}, {"prompt": "e", "completion": "f"}]), KEPT),
    ("keep.csv", "prompt,completion,keep_anchor\na,b, TRUE\nc,d,false\ne,f,\n", KEPT),  # any case; empty: false
    ("keep.parquet", {"prompt": ["a", "c", "e"], "completion": ["b", "d", "f"], "keep_anchor": [True, False, None]}, KEPT),
    ("text.csv", "text,keep_anchor\nb,true\nd,False\n", [Example("", "b", True), Example("", "d", False)]),
    ("none.jsonl", jsonl_of([{"prompt": "a", "completion": "b"}]), [Example("a", "b", False)]),
]


@pytest.mark.parametrize("name, content, expected", KEEP_GOOD, ids=[g[0] for g in KEEP_GOOD])
def test_keep_anchor_column_marks_rehearsal_rows(tmp_path, name, content, expected):
    path = write(tmp_path / name, content)
    examples, _, _ = load_examples(path)
    assert list(examples) == expected and [e.keep_anchor for e in examples] == [e.keep_anchor for e in expected]
    splits = load_splits(path, config=DataConfig(validation_fraction=0.0))
    assert splits.kept == sum(e.keep_anchor for e in expected)


KEEP_BAD = [
    ("yes.jsonl", jsonl_of([{"prompt": "a", "completion": "b", "keep_anchor": "yes"}]), r"row 1.*keep_anchor.*true or false.*string"),
    ("one.json", json.dumps([{"prompt": "a", "completion": "b", "keep_anchor": 1}]), r"row 1.*true or false.*number"),
    ("maybe.csv", "prompt,completion,keep_anchor\na,b,true\nc,d,maybe\n", r"row 2.*'keep_anchor'.*'maybe'"),
    ("ints.parquet", {"prompt": ["a"], "completion": ["b"], "keep_anchor": [1]}, r"keep_anchor.*int64.*true or false"),
]


@pytest.mark.parametrize("name, content, message", KEEP_BAD, ids=[b[0] for b in KEEP_BAD])
def test_keep_anchor_column_accepts_only_true_or_false(tmp_path, name, content, message):
    with pytest.raises(DataError, match=message):
        load_examples(write(tmp_path / name, content))


def test_keep_anchor_survives_the_arrow_split(tmp_path):
    rows = "".join(f"p{i},c{i},{'true' if i % 3 == 0 else 'false'}\n" for i in range(30))
    path = write(tmp_path / "big.csv", "prompt,completion,keep_anchor\n" + rows)
    splits = load_splits(path, config=DataConfig(validation_fraction=0.2, seed=3))
    for part in (splits.train, splits.validation):
        assert all(e.keep_anchor == (int(e.prompt[1:]) % 3 == 0) for e in part)
    assert splits.kept == sum(e.keep_anchor for e in splits.train) and 0 < splits.kept < 10
