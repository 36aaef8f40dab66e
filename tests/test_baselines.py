"""The paper's comparison: the anchor itself trained (LoRA, or its top layers) with as many trainable parameters as
the bridge, on the same data and loss. Pinned: the parameter match, the start equal to the anchor, the shared base
model never changed, a round trip through safetensors, bad input, and the lab's contract."""
import dataclasses
import re

import pytest
import torch
from torch import nn

from calm_core import CALMError, TrainConfig, Trainer
from calm_core.lab.session import LabSession, ModelCache
from calm_core.models.tiny import char_tokenizer, tiny_model
from calm_core.training.baselines import AnchorBaseline, linear_modules, lora_rank
from calm_core.training.examples import Example

from .app_fixtures import write_tiny_preset

pytest.importorskip("peft", reason="peft is in requirements.txt")

CASES = [(arch, method, budget) for arch in ("gpt2", "llama") for method in ("lora", "finetune")
         for budget in (700, 5_000, 20_000)]


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def anchor(tok, arch, seed=0):
    return tiny_model(arch, len(tok), layers=3, width=32, heads=4, seed=seed), tok


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("arch,method,budget", CASES)
def test_trainable_parameters_match_the_budget(tok, arch, method, budget):
    model, _ = anchor(tok, arch)
    baseline = AnchorBaseline((model, tok), method, budget)
    trainable = baseline.num_parameters()[0]
    assert trainable == sum(p.numel() for p in baseline.anchor.model.parameters() if p.requires_grad)
    if method == "lora":  # the nearest rank: within half a rank's cost of the budget
        per_rank = trainable // baseline.rank
        assert abs(trainable - budget) <= per_rank / 2 or baseline.rank == 1
    else:  # whole tensors from the top layer down, never past the budget (one tensor at least)
        assert trainable <= budget or len(baseline.targets) == 1
        assert all(t.startswith(f"{len(baseline.anchor.layers) - 1}.") for t in baseline.targets[:1])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["lora", "finetune"])
def test_starts_as_the_anchor_and_never_changes_the_shared_model(tok, arch, method):
    model, _ = anchor(tok, arch)
    before = snapshot(model)
    baseline = AnchorBaseline((model, tok), method, 5_000)
    reference = model(**tok(["abc+de=", "x"], return_tensors="pt", padding=True)).logits
    batch = baseline.encode(["abc+de=", "x"])
    torch.testing.assert_close(baseline.forward(batch)[0, :7], reference[0, :7], rtol=0, atol=1e-6)
    rows = [Example(prompt="ab", completion="cd"), Example(prompt="xy", completion="z")] * 4
    Trainer(baseline, rows, config=TrainConfig(steps=4, batch_size=4, lr=5e-2, warmup_steps=0, progress=False)).train()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not any(p.requires_grad for p in model.parameters())
    with baseline.gate_scale(0.0):  # the untouched anchor
        torch.testing.assert_close(baseline.forward(batch)[0, :7], reference[0, :7], rtol=0, atol=1e-6)
    assert not torch.allclose(baseline.forward(batch)[0, :7], reference[0, :7])


@pytest.mark.parametrize("method", ["lora", "finetune"])
def test_a_baseline_learns_and_round_trips_through_safetensors(tok, tmp_path, method):
    model, _ = anchor(tok, "llama")
    baseline = AnchorBaseline((model, tok), method, 8_000)
    rows = [Example(prompt=f"{w}=", completion=w[::-1]) for w in ("abc", "bca", "cab", "dog", "god", "odg")]
    result = Trainer(baseline, rows, config=TrainConfig(steps=40, batch_size=6, lr=2e-2, warmup_steps=0,
                                                        log_every=1, progress=False)).train()
    assert result.history[-1]["loss"] < result.history[0]["loss"] - 0.25  # a tiny random model learns slowly
    baseline.save_pretrained(tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["baseline.safetensors", "baseline_config.json"]
    again = AnchorBaseline.from_pretrained(tmp_path / "b", (model, tok))
    batch = baseline.encode(["abc=", "dog="])
    assert torch.equal(again.forward(batch), baseline.forward(batch))
    assert again.generate(["abc="], max_new_tokens=3) == baseline.generate(["abc="], max_new_tokens=3)
    other, _ = anchor(tok, "gpt2")
    with pytest.raises(CALMError, match="does not fit"):
        AnchorBaseline.from_pretrained(tmp_path / "b", (other, tok))


def test_a_model_without_linear_layers_is_named(tok):
    layers = nn.ModuleList([nn.Sequential(nn.Embedding(4, 4), nn.LayerNorm(4))])
    assert linear_modules(None, layers) == {}
    with pytest.raises(CALMError, match="Embedding.*LayerNorm|LayerNorm.*Embedding"):
        lora_rank(nn.Module(), layers, 1000)
    with pytest.raises(CALMError, match="method"):
        TrainConfig(method="prefix")
    model, _ = anchor(tok, "llama")
    with pytest.raises(CALMError, match="budget"):
        AnchorBaseline((model, tok), "lora", 0)


# ---- the lab's contract -----------------------------------------------------------------------------------

@pytest.fixture
def lab(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("presets")
    write_tiny_preset(root)
    monkeypatch.setattr("calm_core.lab.presets.PRESETS_DIR", root)
    session = LabSession(ModelCache())
    session.use_preset("tiny")
    return session


def test_the_lab_trains_a_lora_baseline_on_the_presets_data_and_answers_with_it(lab):
    with pytest.raises(CALMError, match="No lora baseline"):
        lab.baseline("lora")
    anchor_before = snapshot(lab.calm.anchor.model)
    lab.start_training(dataclasses.replace(lab.train_config(), method="lora", steps=3, batch_size=4))
    lab.wait()
    assert not lab.run.running and lab.run.step == 3, lab.run.message
    answers = lab.baseline("lora").generate(["abcd=", "fed="], max_new_tokens=3)
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
    assert lab.baseline("lora").num_parameters()[0] == pytest.approx(lab.calm.num_parameters()[0], rel=0.5)
    assert all(torch.equal(v, lab.calm.anchor.model.state_dict()[k]) for k, v in anchor_before.items())
    with pytest.raises(CALMError, match="Unknown baseline"):
        lab.baseline("prefix")
    # the Evaluate table: the same rows for every model, the baseline named with both parameter counts
    table = lab.evaluate(lab.preset.train_file, ["exact_match", "loss"], max_new_tokens=3, limit=4)
    names = [row["model"] for row in table.rows]
    assert names[2] == "CALM" and len(names) == 4 and names[3].startswith("anchor + LoRA (")
    assert f"bridge {lab.calm.num_parameters()[0]:,}" in names[3]
    assert all({"exact_match", "loss"} <= set(row) for row in table.rows)
    # the forgetting set: the anchor alone at ratio 1 exactly, the augmenting model (another format) left out
    table = lab.evaluate(lab.preset.train_file, ["forgetting"], max_new_tokens=3, limit=2)
    ratio, words = "forgetting: perplexity ratio", "forgetting: expected words"
    rows = {row["model"]: row for row in table.rows}
    assert table.rows[0][ratio] == 1.0 and ratio not in table.rows[1]
    assert rows["CALM"][ratio] > 0 and re.fullmatch(r"\d+/16", rows[names[3]][words])
    # the Chat tab's fourth column: the baseline answers beside the three, as its own generate() does
    *three, fourth = list(lab.replies("abcd=", max_new_tokens=3, baseline="lora"))[-1]
    assert len(three) == 3 and fourth == lab.baseline("lora").generate(["abcd="], max_new_tokens=3)[0]
    assert len(list(lab.replies("abcd=", max_new_tokens=3))[-1]) == 3  # none asked for: the three columns
    with pytest.raises(CALMError, match="No finetune baseline"):
        list(lab.replies("abcd=", max_new_tokens=3, baseline="finetune"))
