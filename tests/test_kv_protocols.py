"""Issue 18 as single commands: the paper's protocol, one ablation per ingredient of the preset, fresh seeds,
and base models copied from another run only where the settings that shape them are the same."""
import dataclasses
import json
import random
import re
from dataclasses import asdict

import pytest

from demos.kv_arithmetic import data as D
from demos.kv_arithmetic.settings import Settings, base_differences, for_run

KEY = r"[a-z]{2,6}"


def test_paper_protocol_composes_on_kv_subs_and_scores_the_number_alone(tmp_path):
    """The composition data are KV-SUBS over the training keys (no arithmetic, no NUM-MATH); KV-MATH is
    answered with the number; a restated answer is wrong, as it is right under ours."""
    from demos.kv_arithmetic.pipeline import make_data, row_scores

    s = for_run(smoke=True, protocol="paper")
    splits = make_data(s, tmp_path)
    kv, files = splits["kv"], splits["files"]
    for name in ("composition_train", "composition_validation"):
        assert files[name]
        for prompt, completion in files[name]:
            assert re.fullmatch(rf"{KEY}(?:[+-]{KEY})+;", prompt), prompt
            keys, ops = re.findall(r"[a-z]+", prompt), re.findall(r"[+-]", prompt)
            assert set(keys) <= set(kv.train_keys)
            assert completion == D.render([kv.values[k] for k in keys], ops)  # the values, no result
    assert all(p.endswith(";") for p, _ in files["eval_kv_subs"])
    assert all(p.endswith("=") and c.lstrip("-").isdigit() for p, c in files["eval_kv_math_heldout"])
    assert "eval_kv_math_heldout_shown" not in files
    paper, ours = row_scores(s), row_scores(Settings())
    for row in ("KV-MATH (held-out keys)", "KV-MATH (train keys)", "NUM-MATH"):
        assert paper[row]("95+22=117") != paper[row]("117") and ours[row]("95+22=117") == ours[row]("117")
    assert paper["KV-SUBS"]("95+22=117") != paper["KV-SUBS"]("95+22")


def test_paper_protocol_base_models_are_plain():
    """m_A: KV-SUBS only (no lookups, no value heads); m_B: NUM-MATH only (no words, no merged values, no
    restating, no noise); free number embeddings in both."""
    from demos.kv_arithmetic.base import MERGED
    from demos.kv_arithmetic.base_models import recipe

    s = for_run(smoke=True, protocol="paper")
    kv = D.make_kv(s.keys, seed=s.seed, train_share=s.train_share)
    a, b = recipe("augment", s, kv), recipe("anchor", s, kv)
    assert a["value_layers"] == [] == b["value_layers"] and b["noise"] == 0
    assert not a["digit_embeddings"] and not b["digit_embeddings"]
    rng = random.Random(0)
    for _ in range(200):
        segs = a["sampler"](rng)
        assert re.fullmatch(rf"{KEY}(?:[+-]{KEY})+;", "".join(seg[0] for seg in segs[:-1]))
        assert segs[-1][1] and re.fullmatch(r"\d+(?:[+-]\d+)+", segs[-1][0])
        segs = b["sampler"](rng)
        assert not any(MERGED in seg[3:] for seg in segs)
        assert re.fullmatch(r"\d+(?:[+-]\d+)+=", "".join(seg[0] for seg in segs[:-1]))
        assert segs[-1][1] and segs[-1][0].lstrip("-").isdigit()


def test_paper_bridge_after_every_other_layer_and_the_window_ablation():
    from demos.kv_arithmetic.pipeline import bridge_config

    paper = bridge_config(for_run(protocol="paper"))
    assert paper.insert == "after" and paper.layer_pairs(4, 4) == [(1, 1), (3, 3)]
    assert paper.window == 0 and not paper.null_slot
    assert bridge_config(for_run(smoke=True, protocol="paper")).layer_pairs(2, 2) == [(1, 1)]
    ours, window = bridge_config(Settings()), bridge_config(for_run(ablation="window"))
    assert ours.insert == "before" and ours.layer_pairs(4, 4) == [(0, 3)] and ours.window == 1
    assert window.window == 0 and {**window.to_dict(), "window": 1} == ours.to_dict()


@pytest.mark.parametrize("name, fields, retrained", [
    ("value-heads", {"augment_value_layers"}, {"augment"}),
    ("digit-embeddings", {"digit_embeddings"}, {"augment", "anchor"}),
    ("merged-slot", {"anchor_merged", "anchor_given"}, {"anchor"}),
    ("window", {"compose_window"}, set()),
])
def test_each_ablation_removes_one_ingredient_and_retrains_only_what_it_touches(name, fields, retrained):
    from demos.kv_arithmetic.base import MERGED
    from demos.kv_arithmetic.base_models import recipe

    preset, s = asdict(Settings()), for_run(ablation=name)
    assert {f for f, v in asdict(s).items() if preset[f] != v} == fields | {"ablation"}
    assert {n for n in ("augment", "anchor") if base_differences(n, preset, s)} == retrained
    kv = D.make_kv(50, seed=0)
    a, b = recipe("augment", s, kv), recipe("anchor", s, kv)
    assert (a["value_layers"] == []) == (name == "value-heads")
    assert a["digit_embeddings"] == b["digit_embeddings"] == (name != "digit-embeddings")
    rng = random.Random(0)
    merged = any(MERGED in seg[3:] for _ in range(100) for seg in b["sampler"](rng))
    assert merged == (name != "merged-slot")


def test_command_line_picks_the_run_names_its_folder_and_flags_override():
    from demos.kv_arithmetic.pipeline import parse

    args, s = parse(["--protocol", "paper"])
    assert args.out == "runs/kv_paper" and s.composition == "kv_subs" and s.whole_answers and s.protocol == "paper"
    args, s = parse(["--ablation", "window", "--compose-window", "2"])
    assert args.out == "runs/kv_window" and s.compose_window == 2 and s.ablation == "window"
    args, s = parse(["--augment-value-layers", "--no-digit-embeddings", "--seed", "1", "--base-from", "x"])
    assert s.augment_value_layers == [] and not s.digit_embeddings and s.base_from == "x" and args.out == "runs/kv_seed1"
    assert parse([])[0].out == "presets/kv_arithmetic" and parse(["--smoke"])[0].out == "runs/kv_smoke"
    assert parse(["--protocol", "paper", "--out", "/tmp/p"])[0].out == "/tmp/p"
    for bad in (["--ablation", "nope"], ["--protocol", "mine"], ["--protocol", "paper", "--ablation", "window"]):
        with pytest.raises(SystemExit):
            parse(bad)


def test_base_from_copies_a_base_model_only_when_what_shapes_it_is_the_same(tmp_path):
    from demos.kv_arithmetic.base import build_model, make_tokenizer, save_model
    from demos.kv_arithmetic.base_models import TRAINED_WITH, copy_base

    s = Settings.smoke()
    kv = D.make_kv(s.keys, seed=s.seed, train_share=s.train_share)
    source, tok = tmp_path / "source", make_tokenizer(s.keys)
    for name in ("augment", "anchor"):
        save_model(build_model(tok, 2, 32), tok, source / name)
        (source / name / TRAINED_WITH).write_text(json.dumps(asdict(s)))
    (source / "data").mkdir()
    (source / "data" / "kv.json").write_text(json.dumps(kv.to_dict()))
    merged = for_run(smoke=True, ablation="merged-slot")
    assert copy_base("augment", merged, kv, source, tmp_path / "a") and (tmp_path / "a/augment/config.json").is_file()
    assert not copy_base("anchor", merged, kv, source, tmp_path / "a") and not (tmp_path / "a/anchor").exists()
    fresh = dataclasses.replace(s, seed=1)
    assert not copy_base("augment", fresh, D.make_kv(s.keys, seed=1), source, tmp_path / "b")
    # an older run: the settings in its table.json, a field it lacks at its default
    (source / "augment" / TRAINED_WITH).unlink()
    record = asdict(s)
    record.pop("digit_embeddings")
    (source / "table.json").write_text(json.dumps({"settings": record}))
    assert copy_base("augment", s, kv, source, tmp_path / "c")
    assert not copy_base("augment", dataclasses.replace(s, digit_embeddings=False), kv, source, tmp_path / "d")
    # a setting added later counts at the value those runs had (m_B's NUM-MATH check off), not today's default
    anchor_record = asdict(s)
    anchor_record.pop("anchor_min_num_math")
    (source / "anchor" / TRAINED_WITH).write_text(json.dumps(anchor_record))
    assert not copy_base("anchor", s, kv, source, tmp_path / "f")
    assert copy_base("anchor", dataclasses.replace(s, anchor_min_num_math=0.0), kv, source, tmp_path / "g")
    (source / "augment" / TRAINED_WITH).write_text(json.dumps({"unfinished": True}))  # killed while training
    assert not copy_base("augment", s, kv, source, tmp_path / "e")


def test_tables_say_which_protocol_ablation_or_seed_they_measured():
    from demos.kv_arithmetic import report

    paper = asdict(for_run(protocol="paper"))
    md = report.markdown({}, settings=paper)
    assert "The paper's protocol, on models from scratch" in md and "nothing built for the bridge" in md
    assert "`ab+xyz;` -> `95+22`" in md and "v1+v2" not in md
    assert "the number alone" in report.answer_formats(paper)["KV-MATH (held-out keys)"]["ours"]
    fresh = report.departures({**asdict(Settings()), "seed": 1})
    assert any("A test set used once: seed 1" in d for d in fresh) and not any("development set" in d for d in fresh)
    # seed 0's held-out keys were a development set: its label sets every shipped fresh table's number beside it
    runs = report.fresh_tables()
    held = [d for d in report.departures(asdict(Settings())) if "development set" in d][0]
    assert len(runs) >= 2 and all(f"seed {seed} {value:.1f}%" in held for seed, value, _ in runs)
    assert [seed for seed, _, checked in runs if not checked] == [1, 2]  # run before m_B was checked
    ablation = asdict(for_run(ablation="value-heads"))
    assert "Ablation of the preset, no value heads" in report.markdown({}, settings=ablation)
    assert report.column_notes(ablation)["m_A"].endswith("with digit embeddings")
    assert "window=0" in report.column_notes(asdict(for_run(ablation="window")))["CALM"]
