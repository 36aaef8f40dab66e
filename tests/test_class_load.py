"""The class load benchmark (benchmarks/class_load.py) at smoke size: four sessions and a fifth on one app process,
the tiny preset everywhere. Its numbers are not checked here (benchmarks/ measures them on the real preset); what is:
the sessions answer under load as they did idle, none lists another's runs, and a training request beyond the
server's places is answered at once with when it can start."""
from __future__ import annotations

from benchmarks import class_load

from .app_fixtures import write_tiny_preset


def test_a_class_at_once_smoke(tmp_path, monkeypatch):
    write_tiny_preset(tmp_path / "presets")
    monkeypatch.setenv("CALM_PRESETS_DIR", str(tmp_path / "presets"))
    monkeypatch.setenv("CALM_DEFAULT_PRESET", "tiny")
    monkeypatch.setenv("CALM_REAL_PAIR_DIR", str(tmp_path / "no-real-pair"))
    result = class_load.main(["--smoke", "--steps", "100000", "--rounds", "2", "--out", str(tmp_path / "load.json")])
    assert len(result["sessions"]) == 3 and all(s["idle_s"] > 0 and s["while_training_s"] > 0 for s in result["sessions"])
    assert result["chats_overlapped_training"], "the chats ended after the training run"
    assert result["goals"]["isolated"], (result["sessions"], result["runs_listed"])
    assert result["goals"]["fifth_told_when"] and result["fifth_answered_in_s"] < 30, result["fifth_training_request"]
    assert "Stopped at step" in result["training_status"] and result["peak_server_mib"] > 0
