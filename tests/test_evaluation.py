import pytest
from sacrebleu.metrics import BLEU, CHRF

from calm_core import CALMConfig, CALMError, ComposedLM
from calm_core.training.data import Example
from calm_core.training.evaluation import evaluate, exact_match_score, text_scores

from .conftest import make_pair


def test_scores_agree_with_sacrebleu_called_directly():
    predicted = ["the cat sat on the mat", "a dog", " 42 "]
    references = ["the cat sat on a mat", "a dog", "42"]
    scores, signatures = text_scores(predicted, references)
    assert scores["bleu"] == BLEU().corpus_score(predicted, [references]).score
    assert scores["chrf"] == CHRF().corpus_score(predicted, [references]).score
    assert scores["exact_match"] == pytest.approx(200 / 3)
    assert signatures["chrf"].startswith("nrefs:1") and "version" in signatures["bleu"]


@pytest.mark.parametrize("predicted, references, expected", [
    (["8", "12"], ["8", "13"], 50.0), ([" 8\n"], ["8"], 100.0), ([], [], 0.0)])
def test_exact_match(predicted, references, expected):
    assert exact_match_score(predicted, references) == expected


def test_one_table_for_anchor_augment_and_composition(tokenizers):
    anchor = make_pair("gpt2", tokenizers["char_bos"], seed=1)
    augment = make_pair("llama", tokenizers["bpe"], seed=2)
    calm = ComposedLM(anchor, [augment], CALMConfig(every=1))
    examples = [Example("ab=", "ba"), Example("cd=", "dc")]
    table = evaluate(calm, examples, max_new_tokens=3)
    assert [r["model"].split(":")[0] for r in table.rows] == ["anchor", "augment 0", "CALM"]
    # closed gates: the composition is the anchor
    assert table.rows[0]["loss"] == pytest.approx(table.rows[2]["loss"], abs=1e-6)
    assert table.predictions[table.rows[0]["model"]] == table.predictions["CALM"]
    assert "| CALM |" in table.to_markdown()
    with pytest.raises(CALMError, match="Unknown metrics"):
        evaluate(calm, examples, metrics=["rouge"])
