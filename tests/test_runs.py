"""Runs kept, compared, exported, loaded and resumed (issue 38): the session's runs folder, the settings file and
command the CLI takes back, resume == uninterrupted, and bad settings files answered by name."""
import json
import zipfile

import pytest
import torch

from calm_core import CALMConfig, CALMError
from calm_core.cli import main as cli_main
from calm_core.lab import run_settings
from calm_core.lab.session import LabSession, ModelCache


@pytest.fixture
def session(preset_root, monkeypatch, tmp_path):
    monkeypatch.setattr("calm_core.lab.presets.PRESETS_DIR", preset_root)
    monkeypatch.setattr("calm_core.lab.run_store.RUNS_ROOT", tmp_path / "runs")
    lab = LabSession(ModelCache())
    lab.use_preset("tiny")
    lab.reset_bridge()
    yield lab
    lab.close()


def _train(lab, name="", stop_at=None, **changes):
    if stop_at is not None:  # a Stop pressed after step `stop_at`, exactly
        record = lab._record

        def stopping(entry):
            record(entry)
            if entry["step"] == stop_at:
                lab.stop_training()
        lab._record = stopping
    run = lab.start_training(lab.train_config(**{"steps": 8, "batch_size": 4, "lr": 5e-3, **changes}), name=name)
    lab.wait()
    lab.__dict__.pop("_record", None)
    return run


def test_every_run_is_kept_with_settings_curves_accuracy_and_its_bridge(session):
    first = _train(session, "lr 5e-3")
    session.reset_bridge()
    _train(session, "lr 2e-2", lr=2e-2)
    records = session.runs.list()
    assert [r.name for r in records] == ["lr 5e-3", "lr 2e-2"] and all(r.status == "finished" for r in records)
    a, b = records
    assert a.id == first.run_id and a.step == 8 and a.history and a.settings["lr"] == 5e-3
    assert [p["step"] for p in a.accuracy][0] == 0 and a.accuracy[-1]["step"] == 8  # from the closed bridge to the end
    assert first.accuracy == a.accuracy and "held-out exact match" in first.message
    assert a.checkpoint() is not None and json.loads((a.checkpoint().parent.parent / "run.json").read_text())["id"] == a.id
    rows = run_settings.differing([a, b])
    assert ["lr", "0.005", "0.02"] in rows and not any(r[0] == "steps" for r in rows)
    with zipfile.ZipFile(session.run_archive(a.id)) as archive:
        names = archive.namelist()
    assert "run.json" in names and "metrics.jsonl" in names
    assert any(n.endswith("bridge.safetensors") for n in names) and any(n.endswith("optimizer.safetensors") for n in names)


def test_the_accuracy_probe_spreads_what_its_share_of_the_projected_run_allows(session):
    from calm_core.training.accuracy_probe import AccuracyProbe

    probe = AccuracyProbe(session.calm, session.splits.validation, sample=4, share=0.1)
    assert probe.due(run_s=5.0, step=0, steps=100)  # the curve's start is always measured
    probe.curve, probe.spent_s = [{"step": 0, "exact_match": 0.0, "seconds": 3.0}], 3.0
    assert not probe.due(run_s=100.0, step=1, steps=100)  # 100 s of fill and a first step: the pace starts here
    # 1 s a step from there: the run projects to 199 s without the probe; the probe may take 10% of the whole,
    # 22.1 s; 3 s spent: 6 more checks, the end's included, one every 16.7 steps
    at = lambda step: probe.due(run_s=100.0 + step - 1, step=step, steps=100)  # noqa: E731
    assert not at(16) and at(17)
    probe.curve.append({"step": 17, "exact_match": 50.0, "seconds": 6.0})  # an open bridge decodes slower
    probe.spent_s = 9.0
    # priced at the dearest check now: (22.1 - 9) // 6 = 2 more, the end's one of them: halfway from 17 to 100
    assert not at(58) and at(59)
    probe.curve.append({"step": 59, "exact_match": 80.0, "seconds": 6.0})
    probe.spent_s = 15.0
    assert not any(at(s) for s in range(60, 100))  # only the end's fits now, and the trainer always takes it
    slow = AccuracyProbe(session.calm, session.splits.validation, sample=4, share=0.1)
    slow.curve, slow.spent_s = [{"step": 0, "exact_match": 0.0, "seconds": 2.0}], 2.0
    slow.due(run_s=0.0, step=1, steps=100)
    # 10 s a step: 990 s, room for 54 more checks: no two closer than a tenth of the run, none in its last tenth
    due = [s for s in range(2, 100) if slow.due(run_s=10.0 * (s - 1), step=s, steps=100) and
           not slow.curve.append({"step": s, "exact_match": 0.0, "seconds": 2.0})]
    assert due == list(range(10, 91, 10))
    _train(session, steps=30)
    probe = session.trainer.probe
    assert probe.curve[0]["step"] == 0 and probe.curve[-1]["step"] == 30 and len(probe.examples) == 10
    assert probe.max_new_tokens == 5  # the longest answer (4 characters) and its end


def test_resume_equals_the_uninterrupted_run(session):
    _train(session, "whole")
    whole = {k: v.clone() for k, v in session.calm.bridge.state_dict().items()}
    whole_losses = [h["loss"] for h in session.runs.list()[0].history]
    session.reset_bridge()
    stopped = _train(session, "stopped", stop_at=3)
    assert stopped.step == 3 and session.runs.get(stopped.run_id).status == "stopped"
    session.reset_bridge()  # the bridge in the page may be anything: resuming takes the run's own
    resumed = session.start_training(None, resume=stopped.run_id)
    session.wait()
    assert resumed.step == 8 and session.runs.get(stopped.run_id).status == "finished"
    for key, value in session.calm.bridge.state_dict().items():
        torch.testing.assert_close(value, whole[key], rtol=1e-5, atol=1e-6)
    assert [h["loss"] for h in session.runs.get(stopped.run_id).history] == pytest.approx(whole_losses, rel=1e-5)
    with pytest.raises(CALMError, match="finished all 8 steps"):
        session.start_training(None, resume=stopped.run_id)


def test_resuming_onto_other_models_or_data_is_refused_with_why(session, preset_root, tmp_path):
    stopped = _train(session, stop_at=2)
    session.build(str(preset_root / "tiny" / "augment"), [str(preset_root / "tiny" / "anchor")], CALMConfig(every=1))
    with pytest.raises(CALMError, match="cannot resume here: it trained on .* the session now has"):
        session.start_training(None, resume=stopped.run_id)
    session.use_preset("tiny")
    other = tmp_path / "other.jsonl"
    other.write_text('{"prompt": "ab=", "completion": "ba"}\n' * 20)
    session.set_data(other)
    with pytest.raises(CALMError, match="other data"):
        session.start_training(None, resume=stopped.run_id)


def test_a_later_run_that_fails_loses_nothing_kept(session, monkeypatch):
    _train(session, "good")
    kept = session.runs.list()[0]
    before = (kept.checkpoint() / "bridge.safetensors").read_bytes()
    monkeypatch.setattr("calm_core.training.trainer.Trainer._train_step",
                        lambda self, use_cache: (_ for _ in ()).throw(RuntimeError("boom")))
    session.reset_bridge()
    run = _train(session, "bad")
    assert "Training failed" in run.message
    good, bad = session.runs.list()
    assert good.status == "finished" and bad.status == "failed"
    assert (good.checkpoint() / "bridge.safetensors").read_bytes() == before


def test_a_downloaded_run_loads_into_another_session_and_resumes_there(session, preset_root, tmp_path):
    stopped = _train(session, "moved", stop_at=3)
    archive = session.run_archive(stopped.run_id)
    other = LabSession(ModelCache())
    try:
        other.use_preset("tiny")
        record = other.import_run(archive)
        assert record.name == "moved (imported)" and record.status == "stopped" and record.step == 3
        other.start_training(None, resume=record.id)
        other.wait()
        assert other.run.step == 8 and other.runs.get(record.id).status == "finished"
    finally:
        other.close()
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("run.json", "{}")
        z.writestr("../../etc/evil.sh", "echo")
    with pytest.raises(CALMError, match="unexpected ../../etc/evil.sh"):
        session.import_run(bad)
    (tmp_path / "not.zip").write_text("hello")
    with pytest.raises(CALMError, match="is not a run's .zip"):
        session.import_run(tmp_path / "not.zip")


def test_the_exported_settings_reproduce_the_run_from_the_command_line(session, tmp_path):
    _train(session, "to export", steps=4)
    record = session.runs.list()[0]
    path = session.run_settings_file(record.id, tmp_path)
    command = session.run_command(record.id)
    assert command.startswith("python -m calm_core train --anchor ") and "--recipe plain" in command
    assert cli_main(["train", "--config", str(path), "--out", str(tmp_path / "cli"), "--no-progress"]) == 0
    cli = [json.loads(line)["loss"] for line in (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()]
    assert cli == pytest.approx([h["loss"] for h in record.history], rel=1e-4)


def test_a_loaded_settings_file_fills_the_next_run(session, tmp_path):
    _train(session, steps=4)
    path = session.run_settings_file(session.runs.list()[0].id, tmp_path)
    text = path.read_text().replace("lr: 0.005", "lr: 0.001").replace("seed: 0", "seed: 3")
    fields, note = session.load_settings(text)
    assert fields["lr"] == 0.001 and note == ""
    config = session.train_config()
    assert config.lr == 0.001 and config.seed == 3 and config.steps == 4


@pytest.mark.parametrize("text, message", [
    ("steps: 5\nlearning_rate: 0.1\n", "unknown setting learning_rate"),
    ("steps: many\n", "steps must be a whole number from 1 to"),
    ("lr: 50\n", "lr must be a number above 0 up to 10"),
    ("batch_size: 0\n", "batch_size must be a whole number from 1 to"),
    ("bf16: sometimes\n", "bf16 must be true or false"),
    ("recipe: magic\n", "recipe must be one of plain, knowledge"),
    ("value_lr_scale: -1\n", "value_lr_scale must be a number from 0 up to 10"),
    ("- steps\n- 5\n", "must hold key: value settings"),
    ("steps: [5\n", "is not YAML or JSON"),
])
def test_bad_settings_files_are_answered_by_key_and_range(session, text, message):
    with pytest.raises(CALMError, match=message):
        session.load_settings(text)
    assert session.loaded_settings == {}


@pytest.mark.parametrize("text, message", [
    ("steps: 5\nlearning_rate: 0.1\n", "unknown option learning_rate"),
    ("steps: many\n", "steps must be a whole number, got 'many'"),
    ("steps: 2.5\n", "steps must be a whole number"),
    ("bf16: 1\n", "bf16 must be true or false"),
    ("recipe: magic\n", "recipe must be one of plain, knowledge"),
    ("steps: 0\n", "TrainConfig.steps must be >= 1"),
    ("weight_decay: 3\n", r"TrainConfig.weight_decay must be in \[0, 1\]"),
])
def test_bad_cli_config_files_are_answered_by_key_and_range(preset_root, tmp_path, text, message, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n' * 4)
    code = cli_main(["train", "--config", str(path), "--data", str(data), "--out", str(tmp_path / "o"),
                     "--anchor", str(preset_root / "tiny" / "anchor"), "--augment", str(preset_root / "tiny" / "augment"),
                     "--every", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and message.replace("\\", "") in err, err


def test_the_cli_resumes_its_own_run_whatever_rows_the_recipe_added(preset_root, tmp_path):
    """A plain-recipe run adds no rows: its empty extra_examples.jsonl must not stop a resume."""
    tiny = preset_root / "tiny"
    common = ["train", "--anchor", str(tiny / "anchor"), "--augment", str(tiny / "augment"), "--every", "1",
              "--data", str(tiny / "data" / "train.jsonl"), "--validation", str(tiny / "data" / "validation.jsonl"),
              "--steps", "4", "--batch-size", "4", "--checkpoint-every", "2", "--log-every", "1", "--no-progress"]
    assert cli_main(common + ["--out", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / "extra_examples.jsonl").read_text() == ""
    assert cli_main(common + ["--out", str(tmp_path / "b"), "--resume",
                              str(tmp_path / "a" / "checkpoints" / "step-000002")]) == 0
    whole = [json.loads(line)["loss"] for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    resumed = [json.loads(line)["loss"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert resumed == pytest.approx(whole[2:], rel=1e-5)
