"""Load: four sessions at once on one server (two training, two chatting, one of them also
uploading a large file); every chat answer equals the same session's answer alone, and the
server's peak memory is reported (test-artifacts/load.json)."""
from __future__ import annotations

import json
import threading
from pathlib import Path
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
from gradio_client import handle_file

from .app_server import SERVER, app_url  # noqa: F401
from .test_app_api import chat, lab, text_of, train

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def _answers(client, prompt: str) -> list[str]:
    return [text_of(h[-1]) for h in chat(client, prompt)]


def test_four_sessions_at_once(app_url, tmp_path):  # noqa: F811
    big = tmp_path / "large.csv"
    with open(big, "w") as f:
        f.write("prompt,completion\n")
        for i in range(100_000):
            word = "".join("abcdef"[(i >> (2 * k)) % 6] for k in range(5))
            f.write(f"{word}=,{word[::-1]}\n")
    trainers, chatters = [lab(app_url), lab(app_url)], [lab(app_url), lab(app_url)]
    prompts = ["abcd=", "fed="]
    solo = [_answers(c, p) for c, p in zip(chatters, prompts)]

    server, peak, done = psutil.Process(SERVER["pid"]), [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], server.memory_info().rss)
            time.sleep(0.1)

    def chatting(k):
        return [_answers(chatters[k], prompts[k]) for _ in range(3)]

    def uploading():
        client = chatters[1]
        note = client.predict(handle_file(str(big)), None, "prompt", "completion", "(none)", 0.0, api_name="/use_data")
        return note

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start_rss = server.memory_info().rss
    with ThreadPoolExecutor(5) as pool:
        runs = [pool.submit(train, t, 40, 1e-2, 8) for t in trainers]
        chats = [pool.submit(chatting, k) for k in range(2)]
        upload = pool.submit(uploading)
        statuses = [r.result(timeout=300)[0] for r in runs]
        answers = [c.result(timeout=300) for c in chats]
        note = upload.result(timeout=300)
    done.set()
    watcher.join()
    for status in statuses:
        assert "Finished 40 steps." in status, status
    assert "100,000 training" in note
    for k in range(2):
        assert all(a == solo[k] for a in answers[k]), (k, answers[k], solo[k])
    ARTIFACTS.mkdir(exist_ok=True)
    report = {"server_rss_before_mb": round(start_rss / 2**20), "server_rss_peak_mb": round(peak[0] / 2**20)}
    (ARTIFACTS / "load.json").write_text(json.dumps(report, indent=2))
    print("load test:", report)
    assert peak[0] < 4 * 2**30
