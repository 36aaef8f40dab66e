"""The recipe's data tricks (training/question_variants.py, training/unknown_subjects.py): each question asked in
surface variants with its subject untouched, and asked again about invented names answered as the anchor answers."""
import random

import pytest

from calm_core import CALMConfig, CALMError, ComposedLM
from calm_core.models.tiny import bpe_tokenizer
from calm_core.training import recipes
from calm_core.training.examples import Example
from calm_core.training.question_variants import variant_examples, vary
from calm_core.training.questions import chat_frame, question_of, render, subject_of
from calm_core.training.unknown_subjects import invented_names, unknown_subject_examples

from .conftest import CORPUS, make_pair

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}<assistant>"
QUESTIONS = ["Where was Ana Bellaro born?", "Which town was Tomas Quiller born in?", "Dario Venn comes from which town?"]


@pytest.fixture(scope="module")
def chat_tokenizer():
    tok = bpe_tokenizer(CORPUS, vocab_size=320, add_bos=False)
    tok.chat_template = TEMPLATE
    return tok


def _rows(tok, frame):
    return [Example(render(tok, [q], frame), f" {q.split()[2]} was born in Ostrava.") for q in QUESTIONS]


@pytest.mark.parametrize("question, subject", [
    ("Where was Albert Einstein born?", "Albert Einstein"),
    ("Dathound Trufeigal was born in which town?", "Dathound Trufeigal"),
    ("Which town was Dathound Trufeigal born in?", "Dathound Trufeigal"),
    ("Hello! Where is Paris?", "Paris"),
    ("I'd like to know the town Ana Li was born in.", "Ana Li"),
    ("what is two plus two?", None),
    ("What is the capital of France?", "France"),
])
def test_the_subject_is_the_longest_run_of_capitalised_words_after_the_question_words(question, subject):
    assert subject_of(question) == subject


def test_invented_names_have_the_subjects_shape_and_no_word_of_the_data():
    subjects = ["Ana Bellaro", "Tomas Quiller", "Dario Venn"]
    taken = {"ana", "bellaro", "tomas", "quiller", "dario", "venn", "ostrava"}
    names = invented_names(subjects, 20, taken, seed=1)
    assert len(names) == 20 == len(set(names)) and names == invented_names(subjects, 20, taken, seed=1)
    assert names != invented_names(subjects, 20, taken, seed=2)
    assert all(len(n.split()) == 2 and all(w[0].isupper() and w.lower() not in taken for w in n.split()) for n in names)
    assert invented_names([], 5, taken) == []


@pytest.mark.parametrize("chat", [True, False])
def test_variants_keep_the_subject_and_the_answer_and_repeat_no_question(chat_tokenizer, chat):
    tok = chat_tokenizer if chat else _no_template()
    frame = chat_frame(tok)
    rows = _rows(tok, frame) + [Example("plain text row", "", keep_anchor=True)]
    varied = variant_examples(tok, rows, per_example=3, seed=0)
    assert len(varied) == 3 * len(QUESTIONS)
    for i, question in enumerate(QUESTIONS):
        subject = subject_of(question)
        group = varied[3 * i:3 * i + 3]
        assert all(v.completion == rows[i].completion and not v.keep_anchor for v in group)
        assert all(subject in v.prompt for v in group)  # never lower-cased nor given a typo
        assert len({v.prompt for v in group} | {rows[i].prompt}) == 4
        if chat:
            assert all(v.prompt.startswith("<user>") and v.prompt.endswith("<assistant>") for v in group)
    assert [v.prompt for v in variant_examples(tok, rows, 3, seed=0)] == [v.prompt for v in varied]
    assert [v.prompt for v in variant_examples(tok, rows, 3, seed=1)] != [v.prompt for v in varied]


def _no_template():
    return bpe_tokenizer(CORPUS, vocab_size=320, add_bos=False)


def test_the_question_is_read_back_from_a_one_turn_chat_prompt_only(chat_tokenizer):
    frame = chat_frame(chat_tokenizer)
    assert question_of(render(chat_tokenizer, ["Where was Ana born?"], frame), frame) == "Where was Ana born?"
    two_turns = render(chat_tokenizer, ["Hi", "Hello!", "Where was Ana born?"], frame)
    assert question_of(two_turns, frame) is None and question_of("no template here", frame) is None
    chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" \
             "<|im_start|>assistant\n"
    tok = _no_template()
    tok.chat_template = "<|im_start|>system\nBe kind.<|im_end|>\n" + chatml  # a system turn before every chat
    frame = chat_frame(tok)
    assert question_of(render(tok, ["Where was Ana born?"], frame), frame) == "Where was Ana born?"
    assert question_of(render(tok, ["Hi", "Hello!", "Where was Ana born?"], frame), frame) is None
    assert chat_frame(_no_template()) is None and question_of("Where was Ana born?\n", None) == "Where was Ana born?"


def test_a_variant_is_drawn_again_when_it_is_a_forbidden_form():
    forbidden = frozenset({"where was {x} born"})
    rng = random.Random(0)
    drawn = [vary(rng, "Where was {x} born?", forbidden) for _ in range(200)]
    assert all(turns[-1].count("{x}") == 1 for turns in drawn)
    assert not any(t[-1].lower().strip("?") == "where was {x} born" for t in drawn)


def _composed(tok):
    anchor = make_pair("gpt2", tok, layers=2, width=32, seed=1)
    augment = make_pair("llama", tok, layers=2, width=24, seed=2)
    return ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[1], augment_layers=[2]))


def test_unknown_subject_rows_ask_the_data_questions_about_invented_names(chat_tokenizer):
    calm, frame = _composed(chat_tokenizer), chat_frame(chat_tokenizer)
    rows = _rows(chat_tokenizer, frame)
    anchor_rows, note = unknown_subject_examples(calm, rows, 6, answer="", new_tokens=3, seed=0)
    assert note.startswith("unknown subjects:") and "keep_anchor" in note
    assert anchor_rows and all(r.keep_anchor for r in anchor_rows)
    fixed, _ = unknown_subject_examples(calm, rows, 6, answer="{subject} was born in an unknown town.", seed=0)
    assert len(fixed) == 6 and not any(r.keep_anchor for r in fixed)
    for row in fixed:
        name = row.completion.split(" was born in")[0]
        assert name in row.prompt and subject_of(question_of(row.prompt, frame)) == name
        assert not any(s in row.prompt for s in ("Ana Bellaro", "Tomas Quiller", "Dario Venn"))
    none, why = unknown_subject_examples(calm, [Example(render(chat_tokenizer, ["what is two plus two?"], frame), " 4")],
                                         5)
    assert none == [] and "cannot apply" in why


def test_the_varied_recipe_adds_both_kinds_of_rows_and_says_so(chat_tokenizer):
    calm = _composed(chat_tokenizer)
    rows = _rows(chat_tokenizer, chat_frame(chat_tokenizer))
    recipe = recipes.Recipe("t", "test", question_variants=2, unknown_subjects=4, unknown_answer="{subject}?",
                            rehearsal_new_tokens=3)
    _, extra, notes = recipes.prepare(calm, recipe, rows, seed=0)
    assert len(extra) == 2 * len(rows) + 4
    assert any(n.startswith("question variants: 6 rows") for n in notes) and any("unknown subjects: 4" in n for n in notes)
    assert calm.recipe["question_variants"] == 2 and "knowledge-varied" in recipes.RECIPES


@pytest.mark.parametrize("field, value", [("question_variants", 9), ("unknown_subjects", -1), ("rehearsal", 2.5)])
def test_recipe_data_steps_are_bounded(field, value):
    with pytest.raises(CALMError, match=f"{field} must be a whole number"):
        recipes.Recipe("t", "test", **{field: value})
