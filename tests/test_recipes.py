"""Recipes (training/recipes.py): named, saved with the bridge, applied to a new bridge once, with a note where a
step cannot apply; LabSession.train_config as the Train tab's complete settings; rehearsal rows."""
import json

import pytest
import torch

from calm_core import CALMConfig, CALMError, ComposedLM
from calm_core.lab.session import LabSession, ModelCache
from calm_core.training import recipes
from calm_core.training.examples import Example
from calm_core.training.forgetting import GENERAL_QUESTIONS
from calm_core.training.rehearsal import rehearsal_examples, rehearsal_questions, uses_chat_template

from .app_fixtures import write_tiny_preset
from .conftest import make_pair

ANSWERS = [Example("ab=", " ba"), Example("cd=", " dc"), Example("ef=", " fe")]


@pytest.mark.parametrize("name, value_lr, position_lr, gate_lr", [
    ("plain", 1.0, 1.0, 1.0),
    ("knowledge", 0.0, 25.0, 5.0),
    ("knowledge-sentence", 0.0, 25.0, 5.0),
])
def test_named_recipes_and_their_learning_rates(name, value_lr, position_lr, gate_lr):
    recipe = recipes.get_recipe(name)
    assert recipe.train_fields() == {"value_lr_scale": value_lr, "position_lr_scale": position_lr,
                                     "gate_lr_scale": gate_lr}
    assert recipes.get_recipe(recipe.to_dict()) == recipe and recipe.summary
    assert recipe.name in recipes.describe()


@pytest.mark.parametrize("bad, message", [
    ("fancy", r"Unknown recipe 'fancy'; the recipes are plain: .*knowledge: "),
    ({"name": "x", "summary": "y", "speed": 3}, r"unknown settings speed"),
])
def test_bad_recipes_are_named(bad, message):
    with pytest.raises(CALMError, match=message):
        recipes.get_recipe(bad)


def test_the_train_config_refuses_an_unknown_recipe():
    from calm_core.training.config import TrainConfig

    with pytest.raises(CALMError, match="TrainConfig.recipe must be one of plain, knowledge"):
        TrainConfig(recipe="fancy")


def _pair(tokenizers, final: bool):
    anchor = make_pair("gpt2", tokenizers["char_bos"], layers=2, width=32, seed=1)
    augment = make_pair("llama", tokenizers["char"], layers=2, width=24, seed=2)
    return ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[1], augment_layers=[2 if final else 1]))


def test_the_vocabulary_start_writes_the_value_path_and_keeps_the_composition_exact(tokenizers):
    calm = _pair(tokenizers, final=True)
    assert recipes.is_new(calm)
    before = {k: v.clone() for k, v in calm.bridge.state_dict().items()}
    ids = calm.anchor.tokenizer(["abcd=dcba"], return_tensors="pt")["input_ids"]
    anchor_logits = calm.anchor.model(ids).logits
    changes, extra, notes = recipes.prepare(calm, recipes.get_recipe("knowledge"), ANSWERS)
    assert changes == {} and extra and all(e.keep_anchor for e in extra)  # no keep_anchor rows: rehearsal added
    assert any("value path started as the vocabulary map" in n and "kept fixed" in n for n in notes)
    after = calm.bridge.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the value path moved
    torch.testing.assert_close(calm.logits(["abcd=dcba"]), anchor_logits)  # gates still closed: the anchor exactly
    assert not recipes.is_new(calm) and calm.recipe["name"] == "knowledge"


@pytest.mark.parametrize("case, patch, why", [
    ("an inner layer", None, "no composition layer reads an augmenting model's final state"),
    ("no shared tokens", "shared", "the two tokenizers share no tokens"),
])
def test_a_step_that_cannot_apply_says_so_and_what_runs_instead(tokenizers, monkeypatch, case, patch, why):
    calm = _pair(tokenizers, final=patch is not None)
    if patch:
        monkeypatch.setattr("calm_core.training.vocab_init.shared_tokens", lambda a, b: [])
    before = {k: v.clone() for k, v in calm.bridge.state_dict().items()}
    changes, _, notes = recipes.prepare(calm, recipes.get_recipe("knowledge"), ANSWERS)
    assert changes == {"value_lr_scale": 1.0}  # a random value path kept fixed would carry nothing
    assert any(why in n and "starts at random and trains at the full rate" in n for n in notes)
    assert all(torch.equal(v, calm.bridge.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize("recency, started", [(4, True), (0, False)])
def test_the_recency_start_opens_attention_on_the_newest_token_or_says_it_cannot(tokenizers, recency, started):
    anchor = make_pair("gpt2", tokenizers["char_bos"], layers=2, width=32, seed=1)
    augment = make_pair("llama", tokenizers["char"], layers=2, width=24, seed=2)
    calm = ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[1], augment_layers=[2], recency=recency))
    anchor_logits = calm.anchor.model(calm.anchor.tokenizer(["abcd=dcba"], return_tensors="pt")["input_ids"]).logits
    _, _, notes = recipes.prepare(calm, recipes.get_recipe("knowledge-sentence"), ANSWERS)
    blocks = calm.bridge.augments[0].blocks
    if started:
        assert any("newest token (recency bias 4 at age 0)" in n for n in notes)
        assert all(torch.all(b.recency[:, 0] == 4) and torch.all(b.recency[:, 1:] == 0) for b in blocks)
    else:
        assert any("recency start cannot apply: the bridge has no recency biases" in n for n in notes)
    torch.testing.assert_close(calm.logits(["abcd=dcba"]), anchor_logits)  # gates still closed: the anchor exactly
    assert calm.recipe["recency_start"] == 4.0


def test_the_recipe_is_saved_with_the_bridge(tokenizers, tmp_path):
    calm = _pair(tokenizers, final=True)
    recipes.prepare(calm, recipes.get_recipe("knowledge"), ANSWERS)
    calm.save_pretrained(tmp_path / "b")
    assert json.loads((tmp_path / "b" / "bridge_config.json").read_text())["recipe"]["name"] == "knowledge"
    anchor, augment = (calm.anchor.model, calm.anchor.tokenizer), (calm.augments[0].model, calm.augments[0].tokenizer)
    loaded = ComposedLM.from_pretrained(tmp_path / "b", anchor, [augment])
    assert loaded.recipe == calm.recipe and not recipes.is_new(loaded)
    plain = ComposedLM(anchor, [augment], calm.config)
    plain.save_pretrained(tmp_path / "old")  # a bridge no recipe started: loaded, it is never started again
    assert not recipes.is_new(ComposedLM.from_pretrained(tmp_path / "old", anchor, [augment]))


def test_rehearsal_rows_are_general_questions_answered_by_the_anchor(tokenizers):
    questions = rehearsal_questions(500)
    assert len(questions) == len(set(questions)) > 60
    assert not set(questions) & {q for q, _ in GENERAL_QUESTIONS}  # the forgetting set is never trained on
    assert rehearsal_questions(5, seed=1) == rehearsal_questions(5, seed=1) != rehearsal_questions(5, seed=2)
    calm = _pair(tokenizers, final=True)
    assert not uses_chat_template(calm.anchor.tokenizer, ANSWERS)  # no template: plain text
    rows = rehearsal_examples(calm, ANSWERS, 16, new_tokens=4)  # a random model's blank answers are dropped
    assert 0 < len(rows) <= 16 and all(r.keep_anchor and r.prompt.endswith("\n") for r in rows)


# ---- the lab -----------------------------------------------------------------------------------------------

@pytest.fixture
def lab(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("presets")
    write_tiny_preset(root)
    monkeypatch.setattr("calm_core.lab.presets.PRESETS_DIR", root)
    return LabSession(ModelCache())


def test_train_config_is_the_recipe_then_the_preset_then_the_changes(lab):
    plain = lab.train_config()
    assert (plain.recipe, plain.steps, plain.value_lr_scale, plain.position_lr_scale) == ("plain", 200, 1.0, 1.0)
    assert plain.cache_budget_mb is None and plain.warmup_steps == 20 and plain.log_every == 5
    lab.use_preset("tiny")  # its train section: how its bridge was trained, under its own (plain) recipe
    shipped = lab.train_config()
    assert (shipped.steps, shipped.lr, shipped.batch_size, shipped.gate_lr_scale, shipped.position_lr_scale) == (
        30, 0.002, 8, 10.0, 3.0)
    assert shipped.warmup_steps == 3 and shipped.eval_every == 6
    lab.set_recipe("knowledge")  # another recipe: its own scales, the preset's steps and learning rate
    knowledge = lab.train_config()
    assert (knowledge.recipe, knowledge.gate_lr_scale, knowledge.position_lr_scale, knowledge.value_lr_scale,
            knowledge.steps, knowledge.lr) == ("knowledge", 5.0, 25.0, 0.0, 30, 0.002)
    lab.reset_bridge()
    assert lab.train_config().recipe == "knowledge"  # Start over keeps it
    assert lab.train_config(steps=7, recipe="plain").position_lr_scale == 3.0  # the preset's own recipe: its scales
    with pytest.raises(CALMError, match="Unknown recipe"):
        lab.set_recipe("fancy")
    lab.use_preset("tiny")
    assert lab.train_config().recipe == "plain"  # the preset's own again


@pytest.mark.parametrize("recorded, native, expected", [
    ("native", True, True), ("native", False, False), (True, False, True), (False, True, False)])
def test_a_presets_precision_native_is_bf16_only_where_the_processor_has_it(lab, monkeypatch, recorded, native,
                                                                            expected):
    lab.use_preset("tiny")
    monkeypatch.setitem(lab.preset.train, "bf16", recorded)
    monkeypatch.setattr("calm_core.lab.session.fast_bf16", lambda device=None: native)
    assert lab.train_config().bf16 is expected
    assert lab.train_config(bf16=not expected).bf16 is (not expected)  # the Train tab's checkbox decides


def test_start_over_trains_with_the_recipe_once_and_the_cache_budget_from_the_ledger(lab):
    lab.use_preset("tiny")
    lab.start_training(lab.train_config(steps=2, batch_size=4))
    lab.wait()
    assert "recipe" not in lab.run.message.split("Finished")[0]  # the shipped bridge: no recipe starts it again
    assert "memory ledger" in lab.run.message and "cache on" in lab.run.message
    lab.reset_bridge()
    assert recipes.is_new(lab.calm)
    lab.start_training(lab.train_config(steps=2, batch_size=4))
    lab.wait()
    assert lab.run.message.startswith("Recipe plain.") and lab.calm.recipe["name"] == "plain", lab.run.message
    lab.start_training(lab.train_config(steps=2, batch_size=4, recipe="knowledge"))
    lab.wait()
    assert "This bridge was started by recipe plain" in lab.run.message


def test_the_reproduce_in_class_benchmark_runs_the_apps_path(lab, capsys):
    """benchmarks/reproduce_preset.py at smoke size: use_preset, reset_bridge, train_config, generate, scored."""
    from benchmarks.reproduce_preset import main

    result = main(["tiny", "--steps", "2", "--limit", "4", "--threads", "1"])
    assert result["recipe"] == "plain" and result["steps"] == 2 and result["examples"] == 4
    assert 0 <= result["exact_match"] <= 100 and result["message"].startswith("Recipe plain.")
    assert '"preset": "tiny"' in capsys.readouterr().out


@pytest.mark.parametrize("prompt, completion, new", [
    ("Which town was Ada Lux born in?", "Ada Lux was born in Taifa.<|im_end|>", " Taifa.<|im_end|>"),
    ("Ada Lux comes from the town of... which one?", "Ada Lux was born in Taifa.", " was born in Taifa."),
    ("ab=", " ba", " ba"),
    ("Say it again: yes", " yes", " yes"),  # nothing new: the whole completion
])
def test_the_value_start_is_weighted_to_the_words_the_prompt_does_not_hold(prompt, completion, new):
    assert recipes.new_words(Example(prompt, completion)) == new
