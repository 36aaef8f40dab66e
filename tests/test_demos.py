"""The demos' data generators and a smoke run of each pipeline at a tiny scale."""
import json
import re
from pathlib import Path

import pytest

from demos.kv_arithmetic import data as D

KEY = r"[a-z]{2,6}"


def test_kv_values_unique_and_in_range():
    kv = D.make_kv(200, seed=3)
    values = list(kv.values.values())
    assert len(kv.values) == 200 and sorted(values) == list(range(1, 201))
    assert all(re.fullmatch(KEY, k) for k in kv.values)
    assert len(kv.train_keys) == 40 and not set(kv.train_keys) & set(kv.heldout_keys)
    assert set(kv.train_keys) | set(kv.heldout_keys) == set(kv.values)
    assert D.make_kv(200, seed=3).values == kv.values  # seeded


def test_formats_match_the_paper():
    values = {"ab": 10, "xyz": 22, "q": 24}
    f = D.formats(values, ["ab", "xyz", "q"], ["+", "-"])
    assert f["kv_subs"] == ("ab+xyz-q=", "10+22-24")
    assert f["num_math"] == ("10+22-24=", "8")
    assert f["kv_math"] == ("ab+xyz-q=", "8")


@pytest.mark.parametrize("operands, restate", [(2, True), (3, True), (2, False)])
def test_splits_keep_heldout_keys_out_of_composition_data(tmp_path, operands, restate):
    from demos.kv_arithmetic.pipeline import Settings, make_data

    s = Settings(keys=60, operands=operands, compose_examples=400, eval_examples=50,  # more than 12 keys allow
                 anchor_restate=restate)
    splits = make_data(s, tmp_path)
    kv, files = splits["kv"], splits["files"]
    held, train = set(kv.heldout_keys), set(kv.train_keys)
    pattern = re.compile(rf"^{KEY}(?:[+-]{KEY}){{{operands - 1}}}=$")
    n_num = 0
    for name in ("composition_train", "composition_validation", "eval_kv_math_trainkeys"):
        for prompt, completion in files[name]:
            keys = re.findall(r"[a-z]+", prompt)
            if not keys:  # the NUM-MATH share of the composition data
                n_num += 1
                assert re.fullmatch(r"\d+(?:[+-]\d+)*=", prompt)
                continue
            assert pattern.match(prompt), prompt
            assert set(keys) <= train and not set(keys) & held
            result = str(D.evaluate([kv.values[k] for k in keys], re.findall(r"[+-]", prompt)))
            if restate and name != "eval_kv_math_trainkeys":  # the anchor's answer: the values, then the result
                values = D.render([kv.values[k] for k in keys], re.findall(r"[+-]", prompt))
                assert completion == f"{values}={result}"
            else:
                assert completion == result
    assert 0 < n_num < len(files["composition_train"])
    assert all(files[name] for name in files), {name: len(rows) for name, rows in files.items()}
    composed = {prompt for prompt, _ in files["composition_train"] + files["composition_validation"]}
    assert not composed & {prompt for prompt, _ in files["eval_kv_math_trainkeys"]}
    for name in ("eval_kv_subs", "eval_kv_math_heldout"):
        for prompt, _ in files[name]:
            assert pattern.match(prompt) and set(re.findall(r"[a-z]+", prompt)) <= held
    for (p1, c1), (p2, c2), (p3, c3) in zip(files["eval_kv_subs"], files["eval_num_math"], files["eval_kv_math_heldout"]):
        assert p1 == p3 and p2 == c1 + "=" and c2 == c3
        assert eval(c1) == int(c3)
    # written as JSON Lines with prompt and completion columns
    rows = [json.loads(line) for line in (tmp_path / "data" / "composition_train.jsonl").read_text().splitlines()]
    assert rows and all(set(r) == {"prompt", "completion"} for r in rows)
    from calm_core.training.data import load_examples

    examples = load_examples(tmp_path / "data" / "eval_kv_math_heldout.jsonl")[0]
    assert len(examples) == len(files["eval_kv_math_heldout"])


def test_base_models_see_only_their_own_skill():
    """m_B never sees a letter (so no key); m_A never sees an arithmetic result; value heads read
    each operand or key's own value at the character right after it."""
    import random

    from demos.kv_arithmetic.recipes import anchor_sampler, augment_sampler

    kv = D.make_kv(100, seed=0)
    rng = random.Random(0)
    anchor, augment = anchor_sampler(100, 2), augment_sampler(kv.values, 2)
    for _ in range(300):
        segments = anchor(rng)
        text = "".join(seg[0] for seg in segments)
        assert re.fullmatch(r"\d+[+-]\d+=-?\d+", text), text
        reads = [seg for seg in segments if len(seg) == 3]
        assert [seg[0] for seg in reads] == re.findall(r"[+=-]", text.split("=")[0] + "=")
        assert [seg[2] for seg in reads] == [int(x) for x in re.findall(r"\d+", text)[:2]]
        segments = augment(rng)
        prompt = "".join(seg[0] for seg in segments if not seg[1])
        completion = "".join(seg[0] for seg in segments if seg[1])
        keys = re.findall(r"[a-z]+", prompt)
        assert set(keys) <= set(kv.values)
        assert re.split(r"[+-]", completion) == [str(kv.values[k]) for k in keys]
        assert [seg[2] for seg in segments if len(seg) == 3] == [kv.values[k] for k in keys]


def test_merged_operands_are_words_carrying_their_value_embedding():
    import random

    import torch

    from demos.kv_arithmetic.base import (
        MERGED,
        build_model,
        encode_segments,
        input_embeddings,
        make_tokenizer,
        number_token_mask,
    )
    from demos.kv_arithmetic.recipes import anchor_sampler

    kv = D.make_kv(100, seed=0)
    sample = anchor_sampler(100, 2, forbidden=set(kv.values), merged=1.0)
    rng = random.Random(0)
    examples = [sample(rng) for _ in range(300)]
    words = [seg for ex in examples for seg in ex if seg[0].isalpha()]
    assert len(words) == 600 and not {w[0] for w in words} & set(kv.values)
    assert all(w[3:] == (MERGED,) and 1 <= w[2] <= 100 for w in words)
    assert not any(seg[0].isdigit() for ex in examples for seg in ex[:-1])  # no operand token left

    tok = make_tokenizer(100)
    ids, _, labels, _, merged = encode_segments(tok, examples[:8])
    inv = {i: t for t, i in tok.get_vocab().items()}
    at = [(i, t) for i, t in zip(*torch.nonzero(merged >= 0, as_tuple=True))]
    assert [int(inv[int(merged[i, t])]) for i, t in at] == [w[2] for ex in examples[:8] for w in ex if w[0].isalpha()]
    assert all(inv[int(ids[i, t])].isalpha() and inv[int(ids[i, t + 1])] in "+-=" for i, t in at)

    model = build_model(tok, layers=1, width=16, seed=0)
    table = model.get_input_embeddings()
    numbers = number_token_mask(tok)
    exact = input_embeddings(model, ids, labels, merged, numbers)
    i, t = at[0]
    assert torch.allclose(exact[i, t], table.weight[ids[i, t]] + table.weight[merged[i, t]])
    noisy = input_embeddings(model, ids, labels, merged, numbers, noise=0.5)
    changed = (noisy - exact).abs().sum(-1) > 0
    assert torch.equal(changed, (merged >= 0) & (labels == -100))  # only the merged operands; never the answer


@pytest.mark.parametrize("text, tokens", [
    ("95+22=117", ["95", "+", "22", "=", "1", "1", "7"]),    # operands whole, the answer digit by digit
    ("abc+xy=-8", ["a", "b", "c", "+", "x", "y", "=", "-", "8"]),
    ("qw7-200=", ["q", "w", "7", "-", "200", "="]),
    ("201+5=", ["2", "0", "1", "+", "5", "="]),              # beyond max_number: digits
    ("abc=95", ["a", "b", "c", "=", "9", "5"]),
])
def test_tokenizer_makes_operands_one_token_and_round_trips(text, tokens):
    from demos.kv_arithmetic.base import make_tokenizer

    tok = make_tokenizer(200)
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.convert_ids_to_tokens(ids[1:]) == tokens
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_digit_embeddings_are_linear_in_the_digits_and_saved_plain(tmp_path):
    import torch

    from demos.kv_arithmetic.base import build_model, load_model, make_tokenizer, save_model

    tok = make_tokenizer(200)
    model = build_model(tok, layers=1, width=16, seed=0)
    v = tok.get_vocab()
    for table in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
        row = lambda n, table=table: table[v[str(n)]]
        torch.testing.assert_close(row(117) - row(17), row(100) - row(0))  # hundreds add independently
        torch.testing.assert_close(row(95) - row(5), row(190) - row(100))  # so do tens
    save_model(model, tok, tmp_path)
    loaded, loaded_tok = load_model(tmp_path)
    assert not any("parametrizations" in name for name in loaded.state_dict())
    torch.testing.assert_close(loaded.get_input_embeddings().weight, model.get_input_embeddings().weight)
    assert loaded_tok.get_vocab() == v


def test_anchor_labels_are_never_keys_and_precede_whole_operands():
    import random

    from demos.kv_arithmetic.base import encode_segments, make_tokenizer
    from demos.kv_arithmetic.recipes import anchor_sampler

    kv = D.make_kv(100, seed=0, min_len=1)
    sample = anchor_sampler(100, 2, forbidden=set(kv.values), labels=0.5)
    rng = random.Random(0)
    examples = [sample(rng) for _ in range(400)]
    labels = [seg[0] for ex in examples for seg in ex if seg[0].isalpha()]
    assert len(labels) > 300 and not set(labels) & set(kv.values)
    tok = make_tokenizer(100)
    ids, _, labels_t, _, _ = encode_segments(tok, examples[:16])
    for row, ex in zip(ids, examples[:16]):
        text = "".join(seg[0] for seg in ex)
        assert tok.decode(row, skip_special_tokens=True) == text
        operands = re.findall(r"\d+(?=[+=-])", text)
        assert [t for t in tok.convert_ids_to_tokens(row) if t in operands][:len(operands)] == operands

def test_kv_smoke_pipeline(tmp_path):
    from demos.kv_arithmetic.pipeline import Settings, run

    result = run(Settings.smoke(), tmp_path)
    table = result["table"]
    assert set(table) == {"KV-SUBS", "NUM-MATH", "KV-MATH (held-out keys)", "KV-MATH (train keys)"}
    assert all(0 <= v <= 100 for row in table.values() for v in row.values())
    for part in ("anchor/model.safetensors", "augment/model.safetensors", "bridge", "data/composition_train.jsonl",
                 "preset.json", "table.json", "table.md", "table.html"):
        assert (tmp_path / part).exists(), part
    preset = json.loads((tmp_path / "preset.json").read_text())
    assert {"name", "title", "description", "example_prompts", "table", "paper_table", "eval_files"} <= set(preset)
    assert preset["protocol"] and "another protocol" in preset["description"]
    # the Evaluate tab measures as the table did (issue 19): scoring per set, the pipeline's answer length
    assert preset["eval_scoring"]["KV-SUBS"] == "substitution" and preset["eval_max_new_tokens"] == 30
    assert set(preset["eval_scoring"]) == set(preset["eval_files"])
    written = json.loads((tmp_path / "table.json").read_text())
    assert {"protocol", "answer_formats", "column_notes", "departures"} <= set(written)
    assert not list(tmp_path.glob("*.done"))  # the base models' hand-over markers are cleaned up
    # a smoke m_B cannot compute after 20 steps: it trains one more round (anchor_extra_rounds=1), recorded
    trained = written["base_trained"]
    assert trained["anchor"]["extra_rounds"] == 1 and trained["anchor"]["steps"] == 40
    assert 0 <= trained["anchor"]["num_math_probe"] < 0.7 and trained["augment"]["extra_rounds"] == 0
    from demos.kv_arithmetic.report import table_figure

    assert len(table_figure(table).data) >= 5

    from demos.kv_arithmetic.base import load_model
    from demos.kv_arithmetic.probe import linear_oracle

    (augment, tok), (anchor, _) = load_model(tmp_path / "augment"), load_model(tmp_path / "anchor")
    kv = D.KVSpace.from_dict(json.loads((tmp_path / "data" / "kv.json").read_text()))
    oracle = linear_oracle(augment, anchor, tok, kv, n_fit=20, n_eval=4)
    assert len(oracle) == 4 and all(0 <= v <= 1 for v in oracle.values())


def test_value_heads_regression_fits_one_hot_digit_codes():
    import torch

    from demos.kv_arithmetic.base import ValueHeads

    digits = torch.tensor([3, 0, 9])
    exact = torch.nn.functional.one_hot(digits, 10).float()
    assert ValueHeads(8, [0], regression=True)._digit_loss(exact, digits) == 0
    assert ValueHeads(8, [0], regression=True)._digit_loss(10 * exact, digits) > 1  # separable is not enough
    assert ValueHeads(8, [0])._digit_loss(10 * exact, digits) < 1e-3


@pytest.mark.parametrize("restate", [True, False])
def test_a_restating_anchor_writes_word_operands_before_the_result(restate):
    """With restate, an expression with a word operand (labelled or merged) is answered "95+22=117", a
    plain one "117"; never a key of D_KV among the words. Scoring reads the result and the substitution."""
    import random

    from demos.kv_arithmetic.base import MERGED
    from demos.kv_arithmetic.recipes import anchor_sampler

    kv = D.make_kv(50, seed=0)
    sample = anchor_sampler(100, 2, forbidden=set(kv.values), labels=0.3, merged=0.3, restate=restate)
    rng, seen = random.Random(1), set()
    for _ in range(300):
        segments = sample(rng)
        answer = segments[-1][0]
        words = [seg[0] for seg in segments if seg[0].isalpha()]
        numbers = [seg[2] if MERGED in seg[3:] else int(seg[0]) for seg in segments[:-1]
                   if (len(seg) > 3 and MERGED in seg[3:]) or seg[0].isdigit()]
        ops = [seg[0] for seg in segments[:-1] if seg[0] in "+-"]
        result = str(D.evaluate(numbers, ops))
        assert not set(words) & set(kv.values)
        expected = f"{D.render(numbers, ops)}={result}" if restate and words else result
        assert answer == expected
        assert D.final_result(answer) == result
        assert D.substitution(answer) == (D.render(numbers, ops) if expected != result else result)
        seen.add(bool(words))
    assert seen == {True, False}


def test_a_given_restatement_is_input_and_the_words_carry_other_values():
    """With `given`, some expressions with merged words come with their operands written as input (no
    loss) and words that carry a wrong value: only the result is a target, computed from the written
    operands. Plain expressions and the other worded ones are unchanged."""
    import random

    from demos.kv_arithmetic.base import MERGED
    from demos.kv_arithmetic.recipes import anchor_sampler, other_value

    sample = anchor_sampler(100, 2, merged=0.5, restate=True, given=0.5)
    rng, kinds = random.Random(3), set()
    for _ in range(300):
        segments = sample(rng)
        written, answer = segments[-2], segments[-1]
        given = written[0].endswith("=") and written[0] != "="
        operands = [("word", seg[2]) if len(seg) > 3 and MERGED in seg[3:] else ("number", int(seg[0]))
                    for seg in segments[:-2 if given else -1] if seg[0].isdigit() or (len(seg) > 3 and MERGED in seg[3:])]
        if not given:
            kinds.add("restated" if any(kind == "word" for kind, _ in operands) else "plain")
            continue
        kinds.add("given")
        assert written[1] is False and answer[1] is True and answer[0].lstrip("-").isdigit()
        shown = [int(x) for x in written[0][:-1].replace("-", "+").split("+")]
        assert len(shown) == len(operands) and any(kind == "word" for kind, _ in operands)
        for (kind, value), x in zip(operands, shown):
            assert value != x if kind == "word" else value == x
        ops = [ch for ch in written[0] if ch in "+-"]
        assert answer[0] == str(D.evaluate(shown, ops))
    assert kinds == {"plain", "restated", "given"}
    rng = random.Random(0)
    for x, top in ((1, 100), (7, 100), (99, 100), (100, 100), (250, 300)):
        others = {other_value(rng, x, top) for _ in range(200)}
        assert x not in others and min(others) >= 1 and max(others) <= top


def test_shipped_preset_carries_values_of_held_out_keys():
    """The shipped bridge (loaded the way the app loads it) answers expressions over keys it never trained on,
    which the anchor alone cannot."""
    from calm_core import ComposedLM
    from calm_core.lab.presets import list_presets, load_preset
    from demos.kv_arithmetic.pipeline import ROW_SCORES, accuracy

    if "kv_arithmetic" not in list_presets():
        pytest.skip("presets/kv_arithmetic not built yet (python -m demos.kv_arithmetic)")
    preset = load_preset("kv_arithmetic")
    calm = ComposedLM.from_pretrained(preset.bridge)
    rows = D.read_jsonl(preset.data_files["eval_kv_math_heldout.jsonl"])[:40]
    row = "KV-MATH (held-out keys)"
    composed = accuracy(calm, None, rows, 30, ROW_SCORES[row])
    anchor = accuracy(calm.anchor.model, calm.anchor.tokenizer, rows, 30, ROW_SCORES[row])
    assert anchor <= 5 and composed >= 40 + anchor
    assert abs(composed - preset.table[row]["CALM"]) <= 25  # 40 of the table's 300 rows


SHIPPED_KV_TABLE = Path(__file__).resolve().parent.parent / "presets" / "kv_arithmetic" / "table.json"


def test_kv_table_labels_say_what_was_measured():
    """Issue 18: the paper's numbers come with its protocol and ours, the answer format and the departures."""
    from demos.kv_arithmetic import report

    table = {row: {col: 50.0 for col in report.COLUMNS} for row in report.ROWS}
    md = report.markdown(table, settings={"keys": 500, "operands": 2, "train_share": 0.2, "anchor_restate": True})
    assert "`k1+k2=` -> `v1+v2=r`" in md and "the number alone" in md and "paper CALM ¹" in md
    assert "¹ The paper's Table 1 under its own protocol" in md and "development set" in md
    assert not re.search(r"\bmet\b|beats the paper", md.replace("met or beaten", "").replace("meets or beats", ""))
    plain = report.protocol({"anchor_restate": False})
    assert "`k1+k2=` -> `r`" in plain and "v1+v2" not in plain
    notes = report.column_notes()
    assert set(report.COLUMNS) | set(report.PAPER_COLUMNS) <= set(notes)


def test_kv_relabel_keeps_every_measured_number(tmp_path):
    """relabel() rewrites the labels of a table.json without touching what was measured."""
    from demos.kv_arithmetic import report

    if not SHIPPED_KV_TABLE.is_file():
        pytest.skip("presets/kv_arithmetic not built")
    shipped = json.loads(SHIPPED_KV_TABLE.read_text())
    (tmp_path / "table.json").write_text(json.dumps(shipped))
    report.relabel(tmp_path)
    again = json.loads((tmp_path / "table.json").read_text())
    assert again == shipped  # the shipped files are what relabel writes
    assert shipped["protocol"] and len(shipped["departures"]) == 4 and shipped["checks"]
    assert "97.5%" in " ".join(shipped["checks"]) and "0%" in " ".join(shipped["checks"])
    assert (tmp_path / "table.md").read_text() == (SHIPPED_KV_TABLE.parent / "table.md").read_text()
