"""demos/unseen_words: the split keeps unseen words out of everything the bridge learns from, the word tokenizer
cuts every form into stem + suffix, m_A's glossed text pairs each word with its gloss, and --smoke runs the
whole pipeline with its controls."""
import json
import random

import pytest

from demos.unseen_words import lexicon as X


@pytest.fixture(scope="module")
def world():
    return X.make_world(0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unseen_words_are_in_no_sentence_the_bridge_learns_from(seed):
    world = X.make_world(seed)
    splits = X.make_splits(world, 300, 20, 20, 40, seed=seed)
    assert world.unseen and world.unseen < set(world.language.lexicon)
    for category in ("noun", "verb", "adjective"):  # a share of each open class, none of the determiners
        assert world.unseen & set(world.language.categories[category])
    assert not world.unseen & set(world.language.categories["determiner"])
    for x in splits.parallel + splits.validation + splits.test_seen:
        assert not x.words() & world.unseen
    assert all(x.words() & world.unseen for x in splits.test_unseen)
    assert len(set(splits.used())) == len(splits.used())  # no sentence in two splits
    seen = set(world.language.lexicon) - world.unseen
    assert set().union(*(x.words() for x in splits.parallel)) == seen  # every seen lemma is taught
    assert splits.coverage(world)["unseen_lemmas_in_parallel_or_validation"] == 0


def test_word_tokenizer_cuts_every_form_into_stem_and_suffix(world):
    tok = X.make_tokenizer(world)
    lang = world.language
    cat, plural_word = "cat", lang.lexicon["cat"] + "i"
    assert tok.tokenize(f"{plural_word} = the cats") == [lang.lexicon["cat"], "##i", "=", "the", cat, "##s"]
    rng = random.Random(0)
    for _ in range(50):
        x = lang.sentence(rng)
        text = lang.foreign(x) + " = " + lang.english(x)
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_glossed_text_pairs_each_foreign_word_with_its_english_gloss(world):
    lang = world.language
    x = lang.sentence(random.Random(3))
    pairs = X.foreign_words(lang, x)
    assert " ".join(w for w, _ in pairs) == lang.foreign(x)
    full = X.glossed(lang, x, random.Random(0), drop=0.0).split()
    assert full == [t for pair in pairs for t in pair]
    assert X.glossed(lang, x, random.Random(0), drop=1.0) == lang.foreign(x)
    glosses = dict(pairs)
    for np in (x.subject, x.object):
        noun = lang.lexicon[np.noun] + ("i" if np.plural else "")
        assert glosses[noun] == np.noun + ("s" if np.plural else "")


def test_the_translation_demo_keeps_its_language(world):
    """make_language grew word-list arguments for this demo; with its defaults it draws the shipped lexicon."""
    from pathlib import Path

    from demos.translation.language import make_language

    shipped = Path("presets/translation/language.json")
    if shipped.exists():
        assert make_language(0).lexicon == json.loads(shipped.read_text())["lexicon"]


def test_smoke_runs_the_whole_pipeline_with_its_controls(tmp_path):
    from demos.unseen_words.pipeline import main

    main(["--smoke", "--out", str(tmp_path), "--threads", "1"])
    record = json.loads((tmp_path / "table.json").read_text())
    columns = set(record["table"]["chrF, test sentences with unseen words"])
    assert {"m_A", "m_B", "CALM", "m_B fine-tuned (parallel set)", "CALM with random m_A",
            "any fluent English (floor)"} <= columns
    assert record["vocab_init"]["augments"][0]["blocks"] == 1
    assert (tmp_path / "bridge" / "bridge.safetensors").exists() and (tmp_path / "table.md").exists()
    rows = [json.loads(line) for line in (tmp_path / "data" / "composition_train.jsonl").read_text().splitlines()]
    world = X.make_world(0)
    tok = X.make_tokenizer(world)
    unseen_tokens = set(world.unseen) | {world.language.lexicon[w] for w in world.unseen}
    assert set(record["unseen"]) == world.unseen
    for r in rows:  # neither the foreign stems nor the English words of an unseen lemma
        assert not set(tok.tokenize(r["prompt"] + r["completion"])) & unseen_tokens
