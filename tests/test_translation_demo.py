"""The translation demo: its made-up language, its splits, a tiny run of the whole pipeline, and
the shipped preset."""
import json
import random
import re

import pytest
import torch

from demos.translation import language as L


def test_lexicon_is_a_seeded_bijection_of_invented_words():
    lang = L.make_language(seed=5)
    words = list(lang.lexicon.values())
    assert set(lang.lexicon) == set(L.NOUNS + L.VERBS + L.ADJECTIVES + L.DETERMINERS)
    assert len(set(words)) == len(words)  # one to one
    english = set(lang.lexicon) | {"some", "an"}
    inflected = {lang.lexicon[n] + L.PLURAL_SUFFIX for n in L.NOUNS} | {lang.lexicon[d] + L.CASE_SUFFIX for d in L.DETERMINERS}
    assert not set(words) & english and not set(words) & inflected  # an inflected word never reads as another
    assert all(re.fullmatch(r"[a-z]{2,}", w) for w in words) and set("".join(words)) <= set(L.ALPHABET)
    assert L.make_language(seed=5).lexicon == lang.lexicon
    assert L.make_language(seed=6).lexicon != lang.lexicon


def test_word_order_and_morphology():
    lang = L.make_language(0)
    x = lang.lexicon
    s = L.Sentence(L.NounPhrase("dog", "big", "the", False), "see", L.NounPhrase("cat", "red", "a", True))
    assert lang.english(s) == "the big dog sees some red cats"
    # subject-object-verb; determiner, noun, adjective; the object's determiner in the object
    # case; the plural suffix on the noun; the verb unchanged
    assert lang.foreign(s) == (f"{x['the']} {x['dog']} {x['big']} {x['a']}{L.CASE_SUFFIX} "
                               f"{x['cat']}{L.PLURAL_SUFFIX} {x['red']} {x['see']}")
    assert lang.foreign(s) == "vo nobi tusat sen pozii dasag lodu"  # the module docstring's example
    plural_subject = L.Sentence(L.NounPhrase("boy", None, "a", True), "eat", L.NounPhrase("apple", None, "a", False))
    assert lang.english(plural_subject) == "some boys eat an apple"
    assert lang.foreign(plural_subject) == f"{x['a']} {x['boy']}{L.PLURAL_SUFFIX} {x['a']}{L.CASE_SUFFIX} {x['apple']} {x['eat']}"
    assert lang.pair(s) == (lang.foreign(s) + " = ", lang.english(s))
    rng = random.Random(1)
    for _ in range(200):
        s = lang.sentence(rng)
        foreign = lang.foreign(s).split()
        assert foreign[-1] == x[s.verb]  # the verb is last
        assert lang.english(s).split()[0] in ("the", "a", "an", "some")


def test_splits_hold_out_sentences_and_cover_the_lexicon():
    lang = L.make_language(0)
    splits = L.make_splits(lang, parallel=120, validation=20, heldout=80, seed=3)
    par = {lang.english(s) for s in splits.parallel}
    assert len(par) == 120 and len(splits.heldout) == 80
    for other in (splits.validation, splits.heldout):
        assert not par & {lang.english(s) for s in other}
    assert not {lang.foreign(s) for s in splits.parallel} & {lang.foreign(s) for s in splits.heldout}
    # every lemma is in the parallel set, so held-out sentences are new combinations of known words
    assert set().union(*(s.words() for s in splits.parallel)) == set(lang.lexicon)
    assert splits.coverage()["heldout_sentences_all_lemmas_seen"] == 80
    again = L.make_splits(lang, parallel=120, validation=20, heldout=80, seed=3)
    assert again.parallel == splits.parallel and again.heldout == splits.heldout


def test_smoke_pipeline_writes_a_preset_that_loads(tmp_path):
    from calm_core import ComposedLM
    from calm_core.lab.presets import load_preset
    from demos.translation.pipeline import Settings, run

    torch.set_num_threads(1)
    result = run(Settings.smoke(), tmp_path / "translation")
    table = result["table"]
    assert set(table["chrF, held-out sentences"]) == {"m_A", "m_B", "CALM", "m_B fine-tuned (parallel set)",
                                                      "CALM with random m_A"}
    assert all(0 <= v <= 100 for v in table["chrF, held-out sentences"].values())
    preset = load_preset("translation", root=tmp_path)
    written = json.loads((tmp_path / "translation" / "table.json").read_text())
    assert {"protocol", "answer_formats", "column_notes", "departures"} <= set(written)
    assert "another task" in (tmp_path / "translation" / "table.md").read_text()
    assert preset.train_file.name == "composition_train.jsonl"
    assert preset.eval_max_new_tokens == preset.max_new_tokens and "held-out sentences" in preset.eval_table_rows
    assert preset.validation_file.name == "composition_validation.jsonl"
    assert all(p.is_file() for p in preset.eval_files.values())
    rows = [json.loads(line) for line in preset.eval_files["held-out sentences"].read_text().splitlines()]
    assert rows and all(r["prompt"].endswith(" = ") for r in rows)
    calm = ComposedLM.from_pretrained(preset.bridge)
    assert isinstance(calm.generate(preset.example_prompts[0], max_new_tokens=4), str)


SHIPPED = "translation"


def test_shipped_preset_loads_and_translates():
    from calm_core import ComposedLM
    from calm_core.lab.presets import PRESETS_DIR, list_presets, load_preset

    if SHIPPED not in list_presets():
        pytest.skip("presets/translation not built yet (python -m demos.translation)")
    preset = load_preset(SHIPPED)
    assert preset.paper_table and preset.table["chrF, held-out sentences"]["CALM"] >= 0
    calm = ComposedLM.from_pretrained(preset.bridge)
    prompt = preset.example_prompts[0]
    out = calm.generate(prompt, max_new_tokens=preset.max_new_tokens)
    assert out and re.fullmatch(r"[a-z ]+", out)
    lang = json.loads((PRESETS_DIR / SHIPPED / "language.json").read_text())
    assert len(set(lang["lexicon"].values())) == len(lang["lexicon"])


def test_shipped_table_names_its_protocol_and_keeps_its_numbers(tmp_path):
    """Issue 18: the shipped table says what was measured next to the paper's figures, and relabel()
    rewrites those labels without touching a measured number."""
    from calm_core.lab.presets import PRESETS_DIR
    from demos.translation import report

    path = PRESETS_DIR / SHIPPED / "table.json"
    if not path.is_file():
        pytest.skip("presets/translation not built yet (python -m demos.translation)")
    shipped = json.loads(path.read_text())
    (tmp_path / "table.json").write_text(json.dumps(shipped))
    report.relabel(tmp_path)
    assert json.loads((tmp_path / "table.json").read_text()) == shipped
    md = (tmp_path / "table.md").read_text()
    assert md == (path.parent / "table.md").read_text()
    assert "another task" in md and "any fluent English (floor)" in md and "FLORES-200" in md
    text = " ".join(shipped["departures"])
    assert "65.9" in text and "99.0" in text and "3.3" in text and "about 18" in text
