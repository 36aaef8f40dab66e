"""The per-session lab behind the app, without a browser: presets, isolation, training, bridge files."""
import zipfile

import pytest
import torch

from calm_core import CALMError
from calm_core.lab import LabSession, ModelCache
from calm_core.training import TrainConfig

from .app_fixtures import write_tiny_preset


@pytest.fixture(scope="module")
def preset_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("presets")
    write_tiny_preset(root)
    return root


@pytest.fixture
def lab(preset_root, monkeypatch):
    monkeypatch.setattr("calm_core.presets.PRESETS_DIR", preset_root)
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
