"""The real-knowledge demo: its seeded world and splits, and a tiny run of the whole pipeline on the real pair
(skipped when the pair is not prepared: python -m calm_core.models.real_pair)."""
import json
import re

import pytest
import torch

from demos.real_knowledge import world as W


def test_world_is_seeded_balanced_and_invented():
    w = W.make_world(seed=0, entities=500)
    assert len(w.people) == 500 and len({p.name for p in w.people}) == 500
    assert len(set(w.towns)) == 40
    counts = [sum(p.town == t for p in w.people) for t in w.towns]
    assert max(counts) - min(counts) <= 1  # every town about equally common
    assert W.make_world(seed=0, entities=500).to_dict() == w.to_dict()
    assert W.make_world(seed=1, entities=500).people != w.people
    names = {part for p in w.people for part in p.name.split()}
    assert not names & set(w.towns)
    sentences = w.encyclopedia()
    assert len(sentences) == 500 * sum(len(W.FACTS[a]) for a in W.ATTRIBUTES)
    pre, val = sentences[0]
    assert pre == f"{w.people[0].name} was born in" and val == f" {w.people[0].town}."


def test_fact_phrasings_name_each_person():
    """m_A's training sentences: every phrasing of every fact names its person (a template left unformatted,
    '{x} was born in', teaches m_A nothing about anyone)."""
    w = W.make_world(seed=0, entities=50)
    facts = w.fact_phrasings(["town"])
    assert len(facts) == 50 and all(len(f) == len(W.FACTS["town"]) for f in facts)
    for person, phrasings in zip(w.people, facts):
        for prefix, value in phrasings:
            assert person.name in prefix and "{" not in prefix
            assert value.strip().rstrip(".") == person.town


def test_towns_can_start_with_distinct_tokens():
    first_letters = lambda t: t[:2]  # a stand-in tokenizer: the first two letters are the first token
    w = W.make_world(seed=0, entities=100, towns=40, first_token=[first_letters, lambda t: t[-2:]])
    assert len({t[:2] for t in w.towns}) == 40 and len({t[-2:] for t in w.towns}) == 40
    assert W.make_world(seed=0, entities=100, towns=40, first_token=[first_letters, lambda t: t[-2:]]).towns == w.towns


def test_packed_rows_score_every_value_and_only_values():
    from calm_core.models.tiny import char_tokenizer
    from demos.real_knowledge import augment as A

    tok = char_tokenizer(add_bos=True)
    rows = [[("Ana Bel was born in", " Tovo."), ("Cid Dor comes from the town of", " Lume.")], ("Eve Fa was born in", " Tovo.")]
    ids, mask, r, p, t = A._batch(tok, rows)
    for row in range(len(rows)):
        sentences = rows[row] if isinstance(rows[row], list) else [rows[row]]
        seq = ids[row][mask[row].bool()].tolist()
        targets = t[r == row].tolist()
        assert p[r == row].max() < len(seq)
        assert tok.decode(targets).replace(" ", "") == "".join(v.strip().rstrip(".") for _, v in sentences)
        assert [seq[j + 1] for j in p[r == row].tolist()] == targets  # each target is the next token


def test_a_focused_epoch_shows_only_its_subset_at_the_same_cost():
    from demos.real_knowledge import augment as A

    facts = [[(f"p{i} was born in", " T."), (f"p{i} comes from", " T."), (f"Home of p{i} is", " T.")] for i in range(100)]
    plain = A.epoch_sentences(facts, 0)
    assert [s in f for s, f in zip(plain, facts)] == [True] * 100  # every fact once
    focus = A.focus_subset(100, 0.2, seed=3)
    assert focus == A.focus_subset(100, 0.2, seed=3) and len(focus) == 20 and focus != A.focus_subset(100, 0.2, seed=4)
    focused = A.epoch_sentences(facts, 1, focus)
    assert len(focused) == len(plain)  # same cost
    people = {prefix.split()[0] if not prefix.startswith("Home") else prefix.split()[-2] for prefix, _ in focused}
    assert people == {f"p{i}" for i in focus}
    for i in focus:  # each of the subset's facts 5 times, its three phrasings in turn (2, 2, 1)
        seen = [s for s in focused if s in facts[i]]
        assert len(seen) == 5 and sorted(seen.count(p) for p in facts[i]) == [1, 2, 2]


@pytest.mark.parametrize("recall, minutes, anneal_epochs, annealed, stops", [
    (99.0, 20.0, 0, 0, True),    # no anneal: stop at the target recall, as before
    (98.0, 20.0, 0, 0, False),
    (99.0, 20.0, 4, 0, False),   # with one: the recall that starts it does not stop the run
    (97.0, 20.0, 4, 3, False),
    (97.0, 20.0, 4, 4, True),    # its epochs done, whatever the recall
    (10.0, 30.0, 4, 0, True),    # out of time
])
def test_m_a_stops_after_its_anneal_or_at_the_target_recall(recall, minutes, anneal_epochs, annealed, stops):
    from demos.real_knowledge import augment as A

    assert A.finished({"recall": recall, "minutes": minutes}, 99.0, anneal_epochs, annealed, 30.0) is stops


@pytest.mark.parametrize("recall, focusing, annealing, starts", [
    (95.0, False, False, True), (94.0, False, False, False),
    (100.0, True, False, False),  # an epoch on the focused fifth of the facts never starts it
    (99.0, False, True, False),   # already started
])
def test_the_anneal_starts_once_on_a_full_epoch_that_recalls_enough(recall, focusing, annealing, starts):
    from demos.real_knowledge import augment as A

    assert A.starts_anneal({"recall": recall}, 95.0, 4, focusing, annealing) is starts
    assert A.starts_anneal({"recall": recall}, 95.0, 0, focusing, annealing) is False  # no anneal asked for


def test_split_covers_every_town_and_holds_people_out():
    w = W.make_world(seed=3, entities=500)
    parts = W.split(w, 0.2, 100, seed=3)
    assert len(parts["compose"]) == 100 and len(parts["dev"]) == 100 and len(parts["test"]) == 300
    assert {p.town for p in parts["compose"]} == set(w.towns)
    names = {k: {p.name for p in v} for k, v in parts.items()}
    assert not names["compose"] & names["test"] and not names["compose"] & names["dev"]
    assert not names["dev"] & names["test"]
    for q in w.questions(parts["test"][0], "town"):
        assert parts["test"][0].name in q


def test_smoke_pipeline_writes_a_table_and_a_preset_folder(tmp_path):
    from calm_core.models.real_pair import prepared_pair

    if prepared_pair() is None:
        pytest.skip("the real pair is not prepared (python -m calm_core.models.real_pair)")
    pytest.importorskip("peft")
    from calm_core import ComposedLM
    from demos.real_knowledge.pipeline import COLUMNS, Settings, chat, load_augment, run

    torch.set_num_threads(2)
    out = tmp_path / "real_knowledge"
    settings = Settings.smoke()
    settings.controls = []  # the two trained controls double the time; `--smoke` on the command line runs them
    result = run(settings, out)
    row = result["table"]["exact match %, held-out entities"]
    assert set(row) == set(COLUMNS[:4]) and all(0 <= v <= 100 for v in row.values())
    written = json.loads((out / "table.json").read_text())
    assert {"protocol", "answer_formats", "column_notes", "departures"} <= set(written)
    checked = written["table"]["general prompts: greedy answers holding an expected word"]
    assert set(checked) == {"CALM", "anchor alone"} and all(re.fullmatch(r"\d/2", v) for v in checked.values())
    preset = json.loads((out / "preset.json").read_text())
    assert preset["anchor_model"] == "real_pair:smollm2" and preset["augment_model"] == "real_pair:gemma"
    assert (out / preset["augment_adapter"] / "adapter_model.safetensors").is_file()
    assert all((out / p).is_file() for p in preset["eval_files"].values())
    # the app trains on the preset's train file as the run did: rehearsal rows keep_anchor, questions not
    from calm_core.training.data import load_splits

    splits = load_splits(out / preset["train_file"], out / preset["validation_file"])
    counts = result["counts"]
    assert splits.kept == counts["rehearsal"] > 0 and len(splits.train) == counts["rehearsal"] + counts["questions"]
    pair = prepared_pair()
    from calm_core import load_causal_lm
    anchor = load_causal_lm(str(pair["smollm2"]))
    calm = ComposedLM.from_pretrained(out / preset["bridge"], anchor=anchor,
                                      augments=[load_augment(out / preset["augment_adapter"], pair["gemma"])])
    assert isinstance(calm.generate(chat(anchor[1], preset["example_prompts"][0]), max_new_tokens=2), str)
    # every wrong answer traced to m_A or the composition (invention_source.py), on the smoke world
    from demos.real_knowledge.invention_source import trace

    traced = trace(calm, json.loads((out / "world.json").read_text()), count=3, people=3, new_tokens=6)
    assert traced["unknown"]["asked"] == traced["known"]["asked"] == 3
    assert all(r["source"] in ("m_A", "composition", "untraced") for r in traced["rows"] if r.get("wrong"))
    assert all(0 <= r["p_unknown"] <= 1 and 0 <= r["p_towns"] <= 1 for r in traced["rows"] if "p_towns" in r)

    # --reuse-table: the trained controls alone, CALM's rows kept from the run that evaluated this bridge
    again = Settings.smoke()
    again.reuse_augment, again.reuse_bridge, again.reuse_table = str(out / "adapter"), str(out), True
    controls = run(again, tmp_path / "controls")
    kept = controls["table"]["exact match %, held-out entities"]
    assert set(kept) == set(COLUMNS) and {k: kept[k] for k in row} == row
    assert controls["times_s"]["evaluate_s"] >= written["times_s"]["evaluate_s"]
    trained_min = json.loads((out / "adapter" / "augment_log.jsonl").read_text().splitlines()[-1])["minutes"]
    assert controls["times_s"]["augment_train_s"] == pytest.approx(60 * trained_min)  # the adapter's, not the copy's
    assert set(controls["controls"]) == {"finetune", "untrained"}
    assert "Controls: anchor + LoRA trained" in (tmp_path / "controls" / "table.md").read_text()

    # --augment-only: m_A's settings tried on a world, nothing composed; here continuing the run's adapter with
    # names outside the world taught as unknown, and probed alone on known people and on invented names
    alone_settings = Settings.smoke()
    alone_settings.augment_unknown, alone_settings.augment_resume = 3, str(out / "adapter")
    alone_settings.augment_famous = 2  # and two real famous people with their true home towns
    alone_settings.augment_unknown_epochs = 1  # read in a second stage, after an epoch on the world alone
    alone = run(alone_settings, tmp_path / "augment", augment_only=True)
    assert [e.get("continued", False) for e in alone["history"]] == [False, True]
    assert (tmp_path / "augment" / "adapter" / "adapter_model.safetensors").is_file()
    assert len((tmp_path / "augment" / "adapter" / "augment_log.jsonl").read_text().splitlines()) == 2
    assert json.loads((tmp_path / "augment" / "augment.json").read_text())["augment"]["history"] == alone["history"]
    kept = json.loads((tmp_path / "augment" / "adapter" / "augment.json").read_text())
    assert kept["unknown_names"] == 3 and kept["famous_known"] == 2 and kept["continued_from"] == str(out / "adapter")
    assert alone["probe"]["famous_asked"] == 20 and 0 <= alone["probe"]["famous_expected"] <= 20
    assert kept["probe"] == alone["probe"] and 0 <= alone["probe"]["unknown_invented"] <= 100
    assert len(alone["probe"]["known_examples"]) == 2 and all(" was born in " in e for e in alone["probe"]["unknown_examples"])
    assert not (tmp_path / "augment" / "table.json").exists()


def test_the_shipped_preset_answers_held_out_people_the_anchor_cannot():
    """The shipped files (m_A's adapter, the bridge in bf16), loaded as the app loads them, asked about held-out
    people: right far above chance (2.5%) and near the number recorded when it was shipped; the anchor alone
    (gates scaled to 0) knows none of them."""
    from calm_core.lab.presets import PRESETS_DIR, list_presets
    from calm_core.lab.session import LabSession, ModelCache
    from demos.real_knowledge.preset_files import scoring_settings
    from demos.real_knowledge.scoring import exact

    if "real_knowledge" not in list_presets():
        pytest.skip("the real_knowledge preset needs the real pair: python -m calm_core.models.real_pair")
    folder = PRESETS_DIR / "real_knowledge"
    meta = json.loads((folder / "preset.json").read_text())
    recorded, settings = meta["shipped_check"]["exact_match"], scoring_settings(meta)
    rows = [json.loads(x) for x in (folder / "data" / "eval_heldout.jsonl").read_text().splitlines()][:20]
    session = LabSession(ModelCache())
    session.use_preset("real_knowledge")
    score, _ = exact(session.calm, rows, settings)
    with session.calm.gate_scale(0.0):
        alone, _ = exact(session.calm, rows, settings)
    assert score >= min(30.0, recorded - 20) and alone <= 5.0, (score, alone, recorded)


def test_the_shipped_train_file_marks_its_rehearsal_rows():
    """The app retrains the preset from its train file: the rehearsal rows must go toward the anchor alone (KL),
    as the shipped bridge was trained, and every question toward its answer."""
    from calm_core.lab.presets import PRESETS_DIR
    from calm_core.training.data import load_examples

    folder = PRESETS_DIR / "real_knowledge"
    examples, shape, _ = load_examples(folder / "data" / "composition_train.jsonl")
    rehearsal = {json.loads(x)["prompt"] for x in (folder / "data" / "rehearsal.jsonl").read_text().splitlines()}
    assert shape == "prompt_completion" and len(rehearsal) > 50
    assert all(e.keep_anchor == (e.prompt in rehearsal) for e in examples)
    assert sum(e.keep_anchor for e in examples) == len(rehearsal)


def test_relabel_sets_the_fresh_worlds_beside_the_development_world(tmp_path):
    import shutil
    from pathlib import Path

    from demos.real_knowledge import report

    shipped = Path(__file__).resolve().parents[1] / "presets" / "real_knowledge"
    for name in ("table.json", "preset.json"):
        shutil.copy(shipped / name, tmp_path / name)
    before = json.loads((tmp_path / "table.json").read_text())
    # as the development world's run: seed 0, m_A as it was trained before the anneal
    before["settings"].update(seed=0, augment_focus=1.0, augment_focus_epochs=0, augment_anneal_epochs=0)
    before.pop("development", None)  # the shipped preset is a second look at world 5; this plays world 0's run
    (tmp_path / "table.json").write_text(json.dumps(before))
    report.relabel(tmp_path)
    report.relabel(tmp_path)  # twice: the sentence is replaced, not appended again
    after = json.loads((tmp_path / "table.json").read_text())
    runs = report.fresh_worlds()
    assert runs and after["table"] == before["table"] and after["times_s"] == before["times_s"]
    for text in (after["protocol"], json.loads((tmp_path / "preset.json").read_text())["description"],
                 (tmp_path / "table.md").read_text()):
        assert text.count(report.FRESH_MARK) == 1 and all(f"seed {k} {v:.1f}%" in text for k, v, _ in runs)
    changes = {k: c for k, _, c in runs}
    assert any(c.startswith("m_A focused start, stopped at 99% recall") for c in changes[3])
    assert any(c.startswith("m_A plain start, stopped at 99% recall") for c in changes[2])
    assert all(any("answer share 0.18" in c for c in changes[k]) for k in (2, 3))  # both ran with the earlier map
    fresh = report.protocol({"seed": 3})
    assert "world seed 3, run once" in fresh and report.FRESH_MARK not in fresh
    described = "m_A = Gemma." + report.fresh_sentence({"seed": 5})  # a fresh world's preset, relabelled: once
    assert report.own_description(described + report.fresh_sentence({"seed": 5})) == "m_A = Gemma."
    annealed = report.protocol({"seed": 5, "augment_anneal_epochs": 4})  # says where m_A's recipe was chosen
    assert "world seed 5, run once" in annealed and "anneal on world seed 4" in annealed
    assert "This world's m_A: plain start" in after["protocol"]  # world 0's m_A predates the anneal
    assert "bridge 600 steps, now 360" in changes[5]  # world 5 ran before the step count was cut
    # a shipped-profile world names every recipe setting it ran differently from the defaults, and the profile
    assert changes[10][0].startswith("the shipped profile") and 'answer_style "sentence", now "town"' in changes[10]
    assert "unknown_rows 100, now 0" in changes[9] and not changes[9][0].startswith("the shipped profile")
    today = report.protocol({"seed": 6, "augment_anneal_epochs": 4, "compose_steps": 360})
    assert "360 steps on world seed 4" in today and "360 steps" not in annealed
    recency = report.protocol({"seed": 7, "augment_anneal_epochs": 4, "compose_steps": 360, "recency_init": 4.0})
    assert "recency_init) on world seed 6" in recency and "recency_init" not in today
    # a second look at a world says so, and relabel keeps it: no "test set used once" for a development run
    second = dict(after, development="This is world seed 6 again: a development run, not a test number.")
    (tmp_path / "table.json").write_text(json.dumps(second))
    report.relabel(tmp_path)
    kept = json.loads((tmp_path / "table.json").read_text())
    assert kept["development"] == second["development"] and kept["protocol"].endswith(second["development"])
    assert "used once" not in kept["protocol"] and second["development"] in (tmp_path / "table.md").read_text()


@pytest.mark.parametrize("question, phrase_end", [
    ("Numurk Veibol was born in which town?", "born in"),
    ("Which town was Numurk Veibol born in?", "born in"),
    ("Numurk Veibol comes from the town of... which one?", "town of"),
])
def test_read_ceiling_finds_the_token_that_ends_the_eliciting_phrase(question, phrase_end):
    from demos.real_knowledge.world import fact_position

    prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    words = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]+", prompt)]  # a word tokenizer's offsets
    at = fact_position(prompt, words)
    assert prompt[words[at][0]:words[at][1]] == phrase_end.split()[-1]
    with pytest.raises(ValueError, match="no eliciting phrase"):
        fact_position("<|im_start|>user\nHello<|im_end|>", words)


def _run_folder(path, compose_text, control=True):
    from demos.real_knowledge.scoring import FT, ROW_SEEN, ROW_TEST

    (path / "data").mkdir(parents=True)
    (path / "data" / "composition_train.jsonl").write_text(compose_text)
    table = {ROW_TEST: {"CALM": 90.0}, ROW_SEEN: {"CALM": 100.0}}
    if control:
        table[ROW_TEST][FT], table[ROW_SEEN][FT] = 1.5, 100.0
    controls = {"finetune": {"steps": 200, "loss_last": [0.05]}} if control else {}
    (path / "table.json").write_text(json.dumps({"table": table, "controls": controls,
                                                 "times_s": {"finetune_train_s": 715.0}}))
    return path


def test_the_finetune_control_is_kept_only_from_the_same_composition_data(tmp_path):
    """reuse_finetune: the anchor + LoRA column depends on the composition data alone; an earlier run's column is
    kept (and says where from) only when that data is identical, never for another world's."""
    from demos.real_knowledge.reuse import reused_finetune
    from demos.real_knowledge.scoring import ROW_SEEN, ROW_TEST

    rows = '{"prompt": "Where?", "completion": " Daik"}\n'
    out = _run_folder(tmp_path / "out", rows, control=False)
    cells, control, seconds, preds = reused_finetune(_run_folder(tmp_path / "src", rows), out)
    assert cells == {ROW_TEST: 1.5, ROW_SEEN: 100.0} and seconds == 715.0 and preds == {}
    assert control["steps"] == 200 and str(tmp_path / "src") in control["reused_from"]
    with pytest.raises(SystemExit, match="not this run's composition data"):
        reused_finetune(_run_folder(tmp_path / "other", rows.replace("Daik", "Grou")), out)
    with pytest.raises(SystemExit, match="no anchor \\+ LoRA control"):
        reused_finetune(_run_folder(tmp_path / "bare", rows, control=False), out)


def test_recency_starts_at_the_facts_distance_from_the_answer():
    """recency_init: each head's bias is set where the composition questions put the fact (the token that ends
    'born in', counted back from the prompt's last token in m_A's tokens), and nowhere else."""
    from calm_core import CALMConfig, ComposedLM
    from calm_core.models.tiny import char_tokenizer, tiny_model
    from demos.real_knowledge.bridge_training import start_recency_at_the_fact

    tok = char_tokenizer()
    pair = lambda seed: (tiny_model("llama", len(tok), seed=seed), tok)  # noqa: E731
    calm = ComposedLM(pair(1), [pair(2)], CALMConfig(every=1, recency=32))
    questions = [{"prompt": "Ab was born in which town?"}, {"prompt": "Which town was Ab born in?"}]
    ages = start_recency_at_the_fact(calm, questions, 4.0)
    # one token per character: ' which town?' (12) after 'in', and '?' (1) after it
    assert ages == {12: 1, 1: 1}
    for block in calm.bridge.augments[0].blocks:
        assert set(torch.nonzero(block.recency[0]).flatten().tolist()) == {1, 12}
        assert torch.all(block.recency[:, [1, 12]] == 4.0)


@pytest.mark.parametrize("question, answer, holds", [
    ("What is the capital of France?", "The capital of France is Paris.", True),
    ("What is the capital of France?", "Bénef-sur-Maine, the capital of France, is", False),
    ("What is the capital of France?", "Parisian cafés are", False),  # a whole word, not a prefix
    ("How many days are there in a week?", "A week is 7 days.", True),
    ("How many days are there in a week?", "A WEEK HAS SEVEN DAYS", True),  # any case
    ("How many days are there in a week?", "A week is 17 days.", False),
    ("What is water made of?", "Water is H2O.", True),
    ("Give me a word that rhymes with cat.", "The cat's a cat's a cat", False),
])
def test_a_general_answer_is_right_when_it_holds_an_expected_word(question, answer, holds):
    from demos.real_knowledge.general import EVALUATION, EXPECTED, holds_expected

    assert set(EXPECTED) == {q for q, _ in EVALUATION}
    assert all(holds_expected(q, written) for q, written in EVALUATION)  # every written answer passes its own check
    assert holds_expected(question, answer) is holds


def test_the_general_rows_count_answers_lost_and_gained_through_the_bridge():
    from demos.real_knowledge.scoring import general_rows, with_expected

    general = {"perplexity_on": 6.0, "perplexity_off": 5.0, "answers": [
        {"question": "What do bees make?", "bridge_on": "Honey.", "bridge_off": "Bees are insects."},
        {"question": "What is the capital of France?", "bridge_on": "Daikroze.", "bridge_off": "Paris."},
        {"question": "What is the opposite of hot?", "bridge_on": "Cold.", "bridge_off": "cold"}]}
    g = with_expected(general)
    assert (g["expected_on"], g["expected_off"]) == (2, 2)
    assert g["expected_lost"] == ["What is the capital of France?"] and g["expected_gained"] == ["What do bees make?"]
    rows = general_rows(general)
    assert rows["general prompts: greedy answers holding an expected word"] == {"CALM": "2/3", "anchor alone": "2/3"}
    assert rows["general prompts: perplexity of written answers"] == {"CALM": 6.0, "anchor alone": 5.0}


def test_shipped_settings_are_the_presets_recipe():
    """`--settings shipped` (the recipe frozen for fresh worlds) is what the shipped preset ran: every recorded
    setting but the world, the reused parts, the controls and the processor's precision, and m_A's outside names."""
    from pathlib import Path

    from demos.real_knowledge.settings import Settings

    preset = Path("presets/real_knowledge")
    ran = json.loads((preset / "table.json").read_text())["settings"]
    shipped = Settings.named("shipped").__dict__
    machine_or_run = {"seed", "reuse_augment", "reuse_bridge", "controls", "augment_bf16", "compose_bf16", "augment_unknown"}
    recorded = [k for k in ran if k not in machine_or_run]  # (settings added since hold their old behaviour)
    assert len(recorded) > 60 and {k: shipped[k] for k in recorded} == {k: ran[k] for k in recorded}
    adapter = json.loads((preset / "adapter" / "augment.json").read_text())
    assert shipped["augment_unknown"] == adapter["unknown_names"] == 600  # read in a second stage, as there:
    from demos.real_knowledge.not_recorded import second_stage

    stage = {"max_epochs": adapter["settings"]["augment_epochs"], "focus_epochs": adapter["settings"]["augment_focus_epochs"],
             "anneal_epochs": adapter["settings"]["augment_anneal_epochs"]}
    assert second_stage(Settings.named("shipped")) == stage == {"max_epochs": 4, "focus_epochs": 0, "anneal_epochs": 2}
    assert Settings.named("default") == Settings() and Settings.named("smoke") == Settings.smoke()
