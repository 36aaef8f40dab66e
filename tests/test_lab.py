"""The per-session lab behind the app, without a browser: presets, isolation, training, bridge files."""
import time
import zipfile

import pytest
import torch

from calm_core import CALMError
from calm_core.lab.session import LabSession, ModelCache
from calm_core.training.trainer import TrainConfig

from .app_fixtures import write_large_csv


@pytest.fixture
def lab(preset_root, monkeypatch):
    monkeypatch.setattr("calm_core.lab.presets.PRESETS_DIR", preset_root)
    return LabSession


def test_sessions_share_models_but_not_bridges(lab):
    cache = ModelCache()
    a, b = lab(cache), lab(cache)
    a.use_preset("tiny")
    b.use_preset("tiny")
    assert a.calm.anchor.model is b.calm.anchor.model
    assert a.calm.bridge is not b.calm.bridge
    before = [g.clone() for g in b.calm.gates()]
    a.start_training(TrainConfig(steps=5, batch_size=4, lr=1e-2, log_every=1, eval_every=5, progress=False))
    a.wait()
    assert a.run.step == 5 and not a.run.running and len(a.run.history) == 5
    assert any(not torch.equal(x, y) for x, y in zip(a.calm.gates(), before))
    assert all(torch.equal(x, y) for x, y in zip(b.calm.gates(), before))


def test_stop_keeps_the_bridge_and_errors_are_messages(lab):
    session = lab(ModelCache())
    with pytest.raises(CALMError, match="No models"):
        session.attention("hi")
    session.use_preset("tiny")
    session.start_training(TrainConfig(steps=10_000, batch_size=4, log_every=1, progress=False))
    with pytest.raises(CALMError, match="in progress"):
        session.start_training(TrainConfig(steps=5, progress=False))
    session.stop_training()
    session.wait(60)
    assert not session.training and session.run.step < 10_000 and "Stopped" in session.run.message


def test_the_attention_map_reads_a_chat_question_as_the_chat_sends_it(lab):
    from calm_core.engine.generation import render_prompt

    session = lab(ModelCache())
    session.use_preset("tiny")
    tokenizer = session.calm.anchor.tokenizer
    plain, chat = session.attention("abcd="), session.attention("abcd=", as_chat=True)
    text, special = render_prompt(tokenizer, [{"role": "user", "content": "abcd="}])
    sent = tokenizer(text, add_special_tokens=special)["input_ids"]  # what the Chat tab's chat mode feeds the anchor
    assert len(chat.anchor_tokens) == len(sent) == chat.maps[0].shape[2] > len(plain.anchor_tokens)
    assert len(plain.anchor_tokens) == len(tokenizer("abcd=")["input_ids"]) == plain.maps[0].shape[2]


def test_replies_stream_three_columns(lab):
    session = lab(ModelCache())
    session.use_preset("tiny")
    steps = list(session.replies("abcd=", max_new_tokens=4))
    final = steps[-1]
    assert len(final) == 3 and all(len(t) > 0 for t in final)
    assert final[0] == session.calm.generate("abcd=", max_new_tokens=4)
    assert final[1] == session.solo(0).generate("abcd=", max_new_tokens=4)
    with session.calm.gate_scale(0):  # with closed gates the composition answers as the anchor
        assert list(session.replies("abcd=", max_new_tokens=4, gate_scale=0))[-1][0] == final[1]


def test_bridge_export_import_and_unsafe_uploads(lab, tmp_path):
    session = lab(ModelCache())
    session.use_preset("tiny")
    with torch.no_grad():
        for p in session.calm.bridge.parameters():
            p.add_(0.1)
    archive = session.export_bridge(tmp_path)
    expected = session.calm.logits(["abcd="])
    other = lab(ModelCache())
    other.use_preset("tiny")
    other.import_bridge([archive])
    torch.testing.assert_close(other.calm.logits(["abcd="]), expected)
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../../bridge_config.json", "{}")
    with pytest.raises(CALMError):
        other.import_bridge([evil])
    with pytest.raises(CALMError, match="not part of a bridge"):
        other.import_bridge([tmp_path / "bridge" / "bridge_config.json", __file__])
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(CALMError, match="not a valid zip"):
        other.import_bridge([bad])
    torch.testing.assert_close(other.calm.logits(["abcd="]), expected)  # nothing lost


def test_unknown_model_and_preset(lab, tmp_path):
    session = lab(ModelCache())
    with pytest.raises(CALMError, match="Could not load model"):
        session.build(str(tmp_path / "nope"), [str(tmp_path / "nope2")])
    with pytest.raises(CALMError, match="No preset named"):
        session.use_preset("missing")


# ---- issue 19: bounds, memory, failed runs, large data, preset settings -------------------------

def test_a_batch_that_would_not_fit_is_refused_before_work_starts(lab, monkeypatch):
    session = lab(ModelCache())
    session.use_preset("tiny")
    monkeypatch.setattr("calm_core.lab.resources.available_bytes", lambda device=None: 200 * 2**20)
    with pytest.raises(CALMError, match=r"batch size 100,000 would need about .* at most batch size [\d,]+ fits"):
        session.start_training(TrainConfig(steps=2, batch_size=100_000, progress=False))
    assert not session.training
    session.start_training(TrainConfig(steps=2, batch_size=4, progress=False))  # a batch that fits still trains
    session.wait(60)
    assert "Finished 2 steps." in session.run.message


def test_a_run_whose_states_do_not_fit_the_cache_says_it_ran_uncached(lab):
    session = lab(ModelCache())
    session.use_preset("tiny")
    session.start_training(TrainConfig(steps=2, batch_size=4, progress=False, cache_budget_mb=1e-6))
    session.wait(60)
    assert "Finished 2 steps." in session.run.message and "cache off" in session.run.message
    assert "over cache_budget_mb" in session.run.message and "every step runs both frozen models" in session.run.message
    session.start_training(TrainConfig(steps=2, batch_size=4, progress=False))  # budget: the memory ledger's room
    session.wait(60)
    assert "cache on" in session.run.message and "the memory ledger" in session.run.message


def test_lr_1e6_leaves_a_good_bridge_and_the_next_run_trains(lab):
    session = lab(ModelCache())
    session.use_preset("tiny")
    session.start_training(TrainConfig(steps=20, lr=1e6, batch_size=4, log_every=1, progress=False))
    session.wait(60)
    assert "diverged" in session.run.message and "restored" in session.run.message
    assert all(torch.isfinite(p).all() for p in session.calm.bridge.parameters())
    assert all(torch.isfinite(g).all() for g in session.calm.gates())
    session.start_training(TrainConfig(steps=10, lr=1e-3, batch_size=4, log_every=1, progress=False))
    session.wait(60)
    assert "Finished 10 steps." in session.run.message
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in session.run.history)
    final = list(session.replies("abcd=", max_new_tokens=4))[-1]
    assert all(isinstance(t, str) for t in final)


def test_a_large_csv_stays_arrow_columns_and_trains_without_preparing_every_row(lab, tmp_path):
    from calm_core.training.data import ArrowExamples

    path = write_large_csv(tmp_path / "large.csv", 60_000)
    session = lab(ModelCache())
    session.use_preset("tiny")
    splits = session.set_data(path, validation_fraction=0.01)
    assert isinstance(splits.train, ArrowExamples) and len(splits.train) == 59_400
    assert splits.train[0].prompt.endswith("=")
    session.start_training(TrainConfig(steps=3, batch_size=4, log_every=1, progress=False))
    session.wait(120)
    assert "Finished 3 steps." in session.run.message
    assert len(session.trainer.train_rows._chunks) <= 12  # only what the three batches touched


def test_stop_with_nothing_running_says_so(lab):
    session = lab(ModelCache())
    session.use_preset("tiny")
    assert session.stop_training() is False


def test_start_over_with_a_closed_bridge_is_the_anchor(lab):
    session = lab(ModelCache())
    session.use_preset("tiny")
    with torch.no_grad():
        for p in session.calm.bridge.parameters():
            p.add_(0.3)
    calm = session.reset_bridge()
    assert all(float(g.abs().max()) == 0 for g in calm.gates())
    torch.testing.assert_close(calm.logits(["abcd="]), session.solo(0).logits(["abcd="]))


@pytest.mark.parametrize("call, message", [
    (lambda s: list(s.replies("abcd=", max_new_tokens=-3)), r"max new tokens must be a whole number from 1 to"),
    (lambda s: list(s.replies("ab" * 6000, max_new_tokens=4)), r"The prompt is [\d,]+ (characters|tokens)"),
    (lambda s: s.attention("abcd" * 1250), r"cross-attention map shows at most \d+ tokens"),
    (lambda s: s.evaluate(s.preset.eval_files["reverse (held out)"], ["exact_match"], 4, -5),
     r"examples must be a whole number from 0 to 10"),
])
def test_nonsense_is_refused_with_the_allowed_range(lab, call, message):
    session = lab(ModelCache())
    session.use_preset("tiny")
    with pytest.raises(CALMError, match=message):
        call(session)


def test_a_bridge_for_other_models_of_the_same_shape_loads_with_a_warning(lab, tmp_path):
    from calm_core import CALMConfig, ComposedLM
    from calm_core.models.tiny import char_tokenizer, tiny_model

    tok = char_tokenizer()
    anchor = tiny_model("gpt2", len(tok) + 40, layers=2, width=32, seed=7)  # another vocabulary, same shape
    augment = tiny_model("llama", len(tok), layers=2, width=32, seed=8)
    ComposedLM((anchor, tok), [(augment, tok)], CALMConfig(every=1)).save_pretrained(tmp_path / "other")
    session = lab(ModelCache())
    session.use_preset("tiny")
    warning = session.import_bridge([tmp_path / "other" / "bridge_config.json", tmp_path / "other" / "bridge.safetensors"])
    assert "trained for other models" in warning and "vocab_size" in warning


def test_composing_the_presets_own_folders_keeps_its_data_and_prompts(lab, preset_root):
    from calm_core import CALMConfig

    session = lab(ModelCache())
    session.use_preset("tiny")
    session.build(str(preset_root / "tiny" / "anchor"), [str(preset_root / "tiny" / "augment")], CALMConfig(every=1))
    assert session.preset is not None and session.preset.example_prompts == ["abcd=", "fed="]
    assert all(float(g.abs().max()) == 0 for g in session.calm.gates())  # a new, closed bridge


def test_models_go_to_the_gpu_in_bf16_when_there_is_one(monkeypatch):
    import calm_core.lab.model_cache as mc

    seen = []
    monkeypatch.setattr(mc, "load_causal_lm", lambda name, dtype=None, trust_remote_code=False, device=None:
                        seen.append((name, dtype, device)) or ("model", "tokenizer"))
    monkeypatch.setattr(mc, "check_memory", lambda *a: None)
    monkeypatch.setattr(mc.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mc.torch.cuda, "is_bf16_supported", lambda: True)
    assert mc.default_device() == "cuda" and mc.default_dtype() == torch.bfloat16
    mc.ModelCache().get("some/model", mc.default_dtype())
    assert seen == [("some/model", torch.bfloat16, "cuda")]
    monkeypatch.setattr(mc.torch.cuda, "is_available", lambda: False)
    assert mc.default_device() == "cpu" and mc.default_dtype() is None


def test_the_server_takes_a_bounded_number_of_training_runs_at_once(lab, monkeypatch):
    import threading

    monkeypatch.setattr("calm_core.lab.training_run.RUNS", threading.BoundedSemaphore(1))
    monkeypatch.setattr("calm_core.lab.training_run.MAX_RUNS", 1)
    a, b = lab(ModelCache()), lab(ModelCache())
    a.use_preset("tiny")
    b.use_preset("tiny")
    a.start_training(TrainConfig(steps=100_000, batch_size=4, progress=False, log_every=1))
    with pytest.raises(CALMError, match="1 training run is in progress on this server.*(only just started|first to end)"):
        b.start_training(TrainConfig(steps=2, batch_size=4, progress=False))
    while a.run.eta_s() is None:  # once its pace is known, the refusal says when a place frees up
        time.sleep(0.05)
    with pytest.raises(CALMError, match=r"the first to end finishes in about \d+ (s|min) \(at its pace so far\)"):
        b.start_training(TrainConfig(steps=2, batch_size=4, progress=False))
    a.stop_training()
    a.wait(60)
    b.start_training(TrainConfig(steps=2, batch_size=4, progress=False))
    b.wait(60)
    assert "Finished 2 steps." in b.run.message


@pytest.mark.parametrize("what", ["examples", "the frozen models' states"])
def test_the_status_says_what_is_being_prepared_before_the_first_step(what):
    from calm_core.lab.training_run import RunState

    status = RunState(total=180, running=True, prepared=(640, 1196), preparing=what).status()
    assert status.startswith(f"Step 0/180 · preparing {what} 640/1,196")
