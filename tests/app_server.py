"""The CALM Lab app (app.py) served in a subprocess over a tiny preset, for the API and browser tests.

conftest.py makes `app_url` one fixture for the whole suite: a test module asks for it, never imports it
(imported, it would be a fixture of that module's own and start a server of its own)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.app_process import AppDidNotStart, free_port, stop, wait_until_answering

from .app_fixtures import write_tiny_preset

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 90
SERVER: dict = {}  # "log": the server's log file, "pid": its process id (for tests that read them)


@pytest.fixture(scope="session")
def app_url(tmp_path_factory):
    """The URL of a running app whose default (and only) preset is a tiny random pair named 'tiny'."""
    yield from serve(tmp_path_factory, real_pair_dir=tmp_path_factory.mktemp("no-real-pair"))  # not prepared


def serve(tmp_path_factory, real_pair_dir):
    """Run app.py over the tiny preset, with the real pair looked for in real_pair_dir; yields its URL."""
    root = tmp_path_factory.mktemp("presets")
    write_tiny_preset(root)
    port = free_port()
    env = dict(os.environ, CALM_PRESETS_DIR=str(root), CALM_DEFAULT_PRESET="tiny", GRADIO_SERVER_PORT=str(port),
               GRADIO_SERVER_NAME="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1",
               CALM_REAL_PAIR_DIR=str(real_pair_dir), CALM_REAL_PAIR_AUTO="0")  # never a 2 min conversion here
    log_path = tmp_path_factory.mktemp("app-log") / "app.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    SERVER.update(log=log_path, pid=process.pid)
    try:
        try:
            wait_until_answering(url, process, log_path, START_TIMEOUT_S)
        except AppDidNotStart as exc:
            pytest.fail(str(exc))
        yield url
    finally:
        stop(process)
