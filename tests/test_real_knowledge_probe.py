"""What the real-knowledge bridge is asked but never trained on (probe_forms.py), the training grammar that must
stay apart from it (phrasings.py), and how answers are scored and the bridge's openings measured
(generalisation.py)."""
import random

import pytest
import torch

from demos.real_knowledge import phrasings as PH
from demos.real_knowledge import probe_forms as P
from demos.real_knowledge import world as W


def _world():
    return W.make_world(5, entities=300, towns=12)


def test_the_training_grammar_never_draws_a_probe_form():
    forbidden = PH._test_forms()
    assert len(forbidden) >= len(P.NEVER_TRAINED) + len(P.DEV_FORMS) - 2  # one greeting turn per chat form
    assert len(P.NEVER_TRAINED) >= 10
    rng = random.Random(0)
    for _ in range(3000):
        turns = PH.draw(rng)
        assert len(turns) in (1, 3) and turns[-1].count("{x}") == 1 and all("{x}" not in t for t in turns[:-1])
        assert PH.V.normal(turns[-1]) not in forbidden
    for form in list(P.NEVER_TRAINED.values()) + list(P.DEV_FORMS.values()):
        assert PH.V.normal(form[-1]) not in {PH.V.normal(c) for c in PH.CORES}


def test_each_composition_person_is_asked_the_trained_forms_then_drawn_ones():
    people = _world().people[:5]
    asked = PH.questions(people, 6, seed=0)
    assert len(asked) == 30
    for p in people:
        forms = [t for q, t in asked if q is p]
        assert [f[0] for f in forms[:3]] == W.QUESTIONS["town"] and len(forms) == 6
    assert PH.questions(people, 6, seed=0) == asked  # seeded
    assert len(PH.questions(people, 3, seed=0)) == 15  # 3: the trained forms only, as before


def test_unknown_names_are_nobody_in_the_world_and_training_never_sees_the_evaluated_ones():
    world = _world()
    evaluated = P.unknown_names(world, 200)
    trained = [n for n, _ in PH.unknown_questions(world, 100, seed=5)]
    known_words = {w for p in world.people for w in p.name.split()} | set(world.towns)
    assert len(set(evaluated)) == 200 and len(set(trained)) == 100
    assert not set(evaluated) & set(trained)
    assert not {w for n in evaluated + trained for w in n.split()} & known_words
    assert P.unknown_names(world, 200) == evaluated


@pytest.mark.parametrize("text, town, named", [
    (" Daikroze", "Daikroze", True),
    ("Numurk Veibol was born in Daikroze.", "Daikroze", True),
    ("Numurk Veibol was born in Daikrozel.", "Daikroze", False),  # a whole word
    ("I don't know.\nDaikroze", "Daikroze", False),  # the first line only
    ("born in daikroze", "Daikroze", False),  # the town's own spelling
])
def test_a_sentence_answer_is_right_when_its_first_line_names_the_town(text, town, named):
    from demos.real_knowledge.scoring import names

    assert names(text, town) is named


def test_trained_answers_in_each_style():
    from demos.real_knowledge.scoring import trained_answer

    assert trained_answer("Daikroze") == " Daikroze"
    assert trained_answer("Daikroze", "Numurk Veibol", "sentence") == "Numurk Veibol was born in Daikroze."
    with pytest.raises(ValueError, match="answer_style"):
        trained_answer("Daikroze", "Numurk Veibol", "poem")


def test_the_first_town_named_decides_a_free_answer():
    from demos.real_knowledge.generalisation import first_town

    towns = ["Daikroze", "Stokairun", "Grou"]
    assert first_town("He was born in Stokairun, not Daikroze.", towns) == "Stokairun"
    assert first_town("Groumur is far from here", towns) is None
    assert first_town("I am not sure.", towns) is None


def test_recency_start_skips_questions_without_an_eliciting_phrase():
    from calm_core import CALMConfig, ComposedLM
    from calm_core.models.tiny import char_tokenizer, tiny_model
    from demos.real_knowledge.bridge_training import start_recency_at, start_recency_at_the_fact

    tok = char_tokenizer()
    pair = lambda seed: (tiny_model("llama", len(tok), seed=seed), tok)  # noqa: E731
    calm = ComposedLM(pair(1), [pair(2)], CALMConfig(every=1, recency=32))
    ages = start_recency_at_the_fact(calm, [{"prompt": "Where does Ab come from?"},
                                            {"prompt": "Which town was Ab born in?"}], 4.0)
    assert ages == {1: 1}
    assert start_recency_at(calm, {0: 5, 99: 1}, 3.0) == {0: 5, 99: 1}  # 99: past the bias table, ignored
    assert torch.all(calm.bridge.augments[0].blocks[0].recency[:, 0] == 3.0)


def test_the_bridge_contribution_is_zero_while_closed_and_the_hooks_are_removed():
    from calm_core import CALMConfig, ComposedLM
    from calm_core.models.tiny import char_tokenizer, tiny_model
    from demos.real_knowledge.generalisation import contribution

    tok = char_tokenizer()
    pair = lambda seed: (tiny_model("llama", len(tok), seed=seed), tok)  # noqa: E731
    calm = ComposedLM(pair(1), [pair(2)], CALMConfig(every=1))
    assert contribution(calm, "Ab was born in") == [0.0] * len(calm.bridge.blocks())  # gates start at zero
    with torch.no_grad():
        for block in calm.bridge.blocks():
            block.gate.fill_(0.5)
    opened = contribution(calm, "Ab was born in")
    assert all(v > 0 for v in opened)
    assert all(not b._forward_hooks for b in calm.bridge.blocks())


@pytest.mark.parametrize("style, completion, value", [
    ("town", "Daikroze", None),  # the file holds the town; exact match on it
    ("sentence", "Numurk Veibol was born in Daikroze.", "Daikroze"),  # the whole sentence, the town kept to score
])
def test_written_question_rows_hold_the_answer_the_bridge_was_trained_to_write(style, completion, value):
    from types import SimpleNamespace

    from demos.real_knowledge.preset_files import as_written

    row = {"prompt": "q", "completion": "Daikroze", "entity": "Numurk Veibol"}
    written = as_written([row], SimpleNamespace(answer_style=style))[0]
    assert written["completion"] == completion and written.get("value") == value
    assert row["completion"] == "Daikroze"  # the run's own rows are left as they were


def test_the_preset_description_tells_what_to_try_with_the_measured_numbers():
    from demos.real_knowledge.preset_files import what_to_try

    g = {"held_out": {"trained forms": {"named_on": 95.0}, "where": {"named_on": 80.0}, "typo": {"named_on": 40.0}},
         "unknown": {"invented": {"invented_on": 43.3, "invented_off": 0.0},
                     "famous": {"expected_on": 4, "expected_off": 6, "asked": 20}},
         "general": {"ratio": 0.981, "expected_on": 9, "expected_off": 10, "prompts": 16}}
    text = what_to_try(g)
    assert "in 2 question forms it never trained on" in text and "60% of answers" in text  # trained forms left out
    assert "weakest: typo, 40%" in text and "43% of such answers" in text and "4/20" in text and "0.98x" in text and "stay out of the way" in text
    assert "NOT yet always does: 43% of such answers" in text and "unknown instead" not in text
    g["unknown"]["invented"]["invented_on"] = 1.0  # within the goal: the page says what happens instead
    text = what_to_try(g)
    assert "says the town is unknown instead of inventing one (1% of such answers" in text and "NOT" not in text


def test_names_m_a_is_taught_as_unknown_are_none_that_evaluation_or_the_bridge_uses():
    from demos.real_knowledge import not_recorded as NR

    world = _world()
    taught = NR.outside_names(world, 150, seed=5)
    evaluated = set(P.unknown_names(world, NR.EVALUATION_NAMES))
    bridge_rows = {n for n, _ in PH.unknown_questions(world, 100, seed=5)}
    known_words = {w for p in world.people for w in p.name.split()} | set(world.towns)
    assert len(set(taught)) == 150 and not set(taught) & (evaluated | bridge_rows)
    assert not {w for n in taught for w in n.split()} & known_words
    entries = NR.facts(world, 3, seed=5)
    assert [len(e) for e in entries] == [3, 3, 3]
    for entry, name in zip(entries, taught):
        assert entry[0] == (f"{name} was born in", " an unknown town.")
        assert all(name in pre and not any(v.strip().startswith(t) for t in world.towns) for pre, v in entry)
    assert NR.facts(world, 3, seed=5) == entries  # seeded


def test_the_famous_people_taught_to_m_a_are_none_the_evaluation_asks():
    from demos.real_knowledge.famous_known import KNOWN_FAMOUS, facts

    taught = [n for n, _ in KNOWN_FAMOUS]
    assert len(set(taught)) == len(taught) >= 60 and not set(taught) & {n for n, _ in P.FAMOUS}
    assert facts(1) == [[("Johann Wolfgang von Goethe was born in", " Frankfurt."),
                         ("Johann Wolfgang von Goethe comes from the town of", " Frankfurt."),
                         ("The home town of Johann Wolfgang von Goethe is", " Frankfurt.")]]


class _Anchor:  # the composition's calls fall_through makes: generation at gate scale 0 only
    def __init__(self, answers, prompts_end=""):
        self.scale, self.answers, self.end, self.asked = 1.0, answers, prompts_end, []

    def gate_scale(self, value):
        from contextlib import contextmanager

        @contextmanager
        def scaled():
            self.scale, before = value, self.scale
            try:
                yield
            finally:
                self.scale = before
        return scaled()

    def generate(self, prompts, max_new_tokens):
        assert self.scale == 0.0 and all(p.endswith(self.end) for p in prompts)
        self.asked += prompts
        return self.answers[:len(prompts)]


def test_invented_name_rows_start_the_sentence_and_the_anchor_alone_finishes_it():
    from demos.real_knowledge.fall_through import anchor_finishes

    rows = [{"prompt": "Q1 ", "completion": "Ab Cd was born in Town.<|im_end|>"},
            {"prompt": "Q2 ", "completion": "Ef Gh was born in an unknown town.<|im_end|>"},
            {"prompt": "Q3 ", "completion": "Ij was born in an unknown town.<|im_end|>"},
            {"prompt": "Q4 ", "completion": "I like tea.", "keep_anchor": True}]
    got = anchor_finishes(_Anchor([" Paris, France. He was", " a village\nnear"], " was born in"), rows)
    assert got[0] == rows[0] and got[3] == rows[3]  # known people and rehearsal rows untouched
    assert got[1]["completion"] == "Ef Gh was born in Paris, France.<|im_end|>"  # to the first full stop, then the end
    assert got[2]["completion"] == "Ij was born in a village"  # no full stop in its first line: no end of turn
    assert rows[1]["completion"].endswith("unknown town.<|im_end|>")  # the input rows are not changed


def test_famous_rehearsal_asks_the_invented_name_questions_about_famous_people_answered_by_the_anchor():
    from demos.real_knowledge.fall_through import famous_rehearsal
    from demos.real_knowledge.famous_known import KNOWN_FAMOUS
    from demos.real_knowledge.probe_forms import FAMOUS

    rows = [{"prompt": "Where was Ab Cd born? ", "completion": "Ab Cd was born in Town.<|im_end|>"},
            {"prompt": "Where was Ef Gh born? ", "completion": "Ef Gh was born in an unknown town.<|im_end|>"},
            {"prompt": "Ij, where from? ", "completion": "Ij was born in an unknown town.<|im_end|>"},
            {"prompt": "Kl Mn? ", "completion": "Kl Mn was born in an unknown town.<|im_end|>"}]
    anchor = _Anchor(["Goethe was born in Frankfurt. He", "He was born\nin", ""])
    got = famous_rehearsal(anchor, rows)
    assert got[:4] == rows and len(got) == 6  # the rows kept; an empty answer adds no row
    first, second = KNOWN_FAMOUS[0][0], KNOWN_FAMOUS[1][0]
    assert anchor.asked == [f"Where was {first} born? ", f"{second}, where from? ", f"{KNOWN_FAMOUS[2][0]}? "]
    assert got[4] == {"prompt": f"Where was {first} born? ", "completion": "Goethe was born in Frankfurt.<|im_end|>",
                      "keep_anchor": True, "famous": True}
    assert got[5]["completion"] == "He was born" and got[5]["keep_anchor"]  # no full stop: no end of turn
    assert not {n for n, _ in KNOWN_FAMOUS} & {n for n, _ in FAMOUS}  # none of them is asked in the evaluation
    assert len(famous_rehearsal(_Anchor(["A was born in B."]), rows, count=1)) == 5  # the first question only
    anchor = _Anchor(["A.", "B.", "C.", "D."])
    got = famous_rehearsal(anchor, rows, count=4, ask=lambda i, name: f"form {i % 2}: {name}?")
    assert anchor.asked == [f"form {i % 2}: {KNOWN_FAMOUS[i][0]}?" for i in range(4)] and len(got) == 8


def test_fresh_world_table_reads_each_run_and_states_the_spread(tmp_path):
    """fresh_worlds.py: one row per run folder from its table.json and generalisation.json, the never-trained forms'
    mean and lowest form, and min / median / max over the worlds."""
    import json

    from demos.real_knowledge import fresh_worlds as F

    folders = []
    for seed, held, forms, invented, ratio in ((9, 90.0, {"where": 80.0, "one word": 20.0}, 4.0, 1.02),
                                              (10, 96.0, {"where": 100.0, "one word": 60.0}, 10.0, 1.10),
                                              (11, 93.0, {"where": 90.0, "one word": 50.0}, 2.0, 0.99)):
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        held_out = {F.HELD_OUT: {"CALM": held, "anchor alone": 0.0, "m_A alone (chat question)": 0.0}}
        (run / "table.json").write_text(json.dumps({"settings": {"seed": seed}, "table": held_out,
                                                    "times_s": {"augment_train_s": 600, "bridge_train_s": 300},
                                                    "augment": {"probe": {"unknown_invented": 8.0}}}))
        gen = {"held_out": {F.TRAINED: {"named_on": 95.0}, **{k: {"named_on": v} for k, v in forms.items()}},
               "unknown": {"invented": {"invented_on": invented, "invented_off": 0.0},
                           "famous": {"expected_on": 3, "expected_off": 8, "asked": 20}},
               "general": {"ratio": ratio}}
        (run / "generalisation.json").write_text(json.dumps(gen))
        folders.append(str(run))
    out = tmp_path / "fresh.md"
    F.main(folders + ["--out", str(out)])
    text = out.read_text()
    assert "| 9 | 90.0 | 95.0 | 50.0 (one word: 20.0) | 4% (8%) | 3 / 8 of 20 | 1.020 | 10.0 + 5.0 min |" in text
    assert "held out 90.0 / 93.0 / 96.0" in text and "never-trained forms 50.0 / 70.0 / 80.0" in text
    assert "invented names 2.0 / 4.0 / 10.0%" in text and "perplexity ratio 0.990 / 1.020 / 1.100" in text
    assert [r["seed"] for r in json.loads(out.with_suffix(".json").read_text())] == [9, 10, 11]


@pytest.mark.parametrize("kind, town, seen, source", [
    # an invented name answered with a town: m_A's when m_A there leaned to the towns, else the composition's
    ("unknown", None, {"p_unknown": 0.05, "p_towns": 0.94, "top_town": "Mudun", "p_top_town": 0.9}, "m_A"),
    ("unknown", None, {"p_unknown": 0.97, "p_towns": 0.01, "top_town": "Mudun", "p_top_town": 0.01}, "composition"),
    # a known person answered wrongly: the composition's only when m_A's own next word was the person's town
    ("known", "Mudun", {"p_unknown": 0.0, "p_towns": 1.0, "top_town": "Mudun", "p_top_town": 1.0}, "composition"),
    ("known", "Mudun", {"p_unknown": 0.77, "p_towns": 0.2, "top_town": "Mudun", "p_top_town": 0.2}, "m_A"),
    ("known", "Mudun", {"p_unknown": 0.0, "p_towns": 1.0, "top_town": "Bramand", "p_top_town": 0.6}, "m_A"),
])
def test_a_wrong_answer_is_traced_to_m_a_when_m_a_itself_was_wrong_there(kind, town, seen, source):
    from demos.real_knowledge.invention_source import cut_before, source_of, summary

    assert source_of(kind, town, seen) == source
    line = "Kerar Lusi was born in Mudun, a town in the west."
    assert cut_before(line, "Mudun") == "Kerar Lusi was born in"  # what was written when the town was chosen
    rows = [{"kind": kind, "wrong": "Mudun", "source": source, "top_town": "Mudun"}, {"kind": kind}]
    counted = summary(rows)[kind]
    assert counted["asked"] == 2 and counted["wrong"] == 1 and counted[source] == 1
    assert counted["m_A_top_town"] == (source == "composition")  # the composition wrote m_A's own likeliest town


def test_a_louder_bridge_trace_says_its_scale_and_perplexity():
    from demos.real_knowledge.invention_source import markdown, summary

    rows = [{"kind": "unknown", "name": "Kerar Lusi", "question": "Where was Kerar Lusi born?", "town": None,
             "answer": "Kerar Lusi was born in Mudun.", "wrong": "Mudun", "source": "composition", "p_unknown": 0.97,
             "p_towns": 0.02, "top_town": "Mudun", "p_top_town": 0.01}]
    result = dict(summary(rows), split="dev", gate_scale=1.5, general={"ratio": 1.199})
    text = markdown(result, "run")
    assert "contributions x1.5" in text and "1.199" in text and "| unknown | Where was Kerar Lusi born? |" in text
    assert "Of the composition's 1 inventions, 1 name the very town" in text
    assert "contributions x" not in markdown(dict(result, gate_scale=1.0), "run")  # as trained: no scale named
