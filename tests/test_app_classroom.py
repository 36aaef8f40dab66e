"""What a classroom of untrusted users tries (issue 19), through the app's endpoints: every number has
a range that is checked before work starts, large data trains at once and Stop answers, the preset's
settings reach Chat and Evaluate, the head menu follows the bridge, handled errors log no traceback; and
a load test: four sessions at once, each chat answer equal to the same session's answer alone, the
server's peak memory written to test-artifacts/load.json."""
from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from .app_fixtures import write_large_csv
from .app_server import SERVER
from .test_app_api import PRESET, chat, client, lab, plotly_data, still_works, table, text_of, train, wait_for_a_step  # noqa: F401


def test_batch_100000_is_refused_with_the_allowed_range(client):
    with pytest.raises(AppError, match=r"batch size must be a whole number from 1 to 4,096; got 100000"):
        train(client, 2, 1e-2, 100_000)
    assert train(client, 2)[0].startswith("Step 2/2")  # the server and the session are fine


def test_a_large_csv_trains_at_once_and_stop_answers(client, tmp_path):
    path = write_large_csv(tmp_path / "large.csv", 60_000)
    note = client.predict(handle_file(str(path)), None, "prompt", "completion", "(none)", 0.0, api_name="/use_data")
    assert "60,000 training" in note
    job = client.submit(5000, 1e-3, 4, api_name="/train")
    wait_for_a_step(job)
    assert client.predict(api_name="/stop").startswith("Stopping")
    assert "Stopped at step" in job.result(timeout=60)[0]
    assert client.predict(api_name="/stop") == "Nothing is training."


def test_a_learning_rate_out_of_range_is_refused(client):
    with pytest.raises(AppError, match=r"learning rate must be a number above 0 up to 10; got 1000000"):
        train(client, 3, 1e6)
    still_works(client)


def test_the_presets_settings_reach_chat_and_evaluate(client):
    out = client.predict(PRESET, api_name="/use_preset")
    eval_tokens, chat_tokens, mode = out[17], out[18], out[19]
    assert eval_tokens["value"] == 6 and chat_tokens["value"] == 6 and mode["value"] == "completion"
    assert "Tiny test pair" in out[16] and "random tiny models" in out[16]  # the preset's story
    assert out[20] == out[21] == out[22] == [] and out[23] == ""  # the previous chat is gone
    steps, lr, batch, gate_lr, noise, note = out[24:30]  # the Train fields as the preset's bridge was trained
    assert (steps["value"], lr["value"], batch["value"], gate_lr["value"], noise["value"]) == (30, 0.002, 8, 10.0, 0.0)
    assert "3× the learning rate" in note and "preset `tiny`" in note


def test_the_head_menu_follows_the_bridge(client):
    out = client.predict(PRESET, api_name="/use_preset")
    heads = table(out[0])[1][-1][5]
    assert [str(c[0]) for c in out[15]["choices"]] == ["mean"] + [str(i) for i in range(heads)]
    plotly_data(client.predict("abcd=dcba", 0, heads - 1, api_name="/attention"))
    allowed = ", ".join(str(i) for i in range(heads))  # the menu refuses it, or the handler does
    with pytest.raises(AppError, match=rf"(10 is not in the list of choices: \['mean', {allowed}\]|head must be a "
                                       rf"whole number from 0 to {heads - 1} \(this bridge has {heads})"):
        client.predict("abcd=dcba", 0, 10, api_name="/attention")
    still_works(client)


@pytest.mark.parametrize("endpoint, args, message", [
    ("/chat", ("abcd=", [], [], [], -3, False, 1.0, 0, 1.0, 0, 1.0, [], "completion"), r"(max new tokens must be a whole|Value -3 is less than minimum value 1)"),
    ("/chat", ("ab" * 6000, [], [], [], 6, False, 1.0, 0, 1.0, 0, 1.0, [], "completion"), r"The prompt is [\d,]+"),
    ("/attention", ("abcd" * 1250, 0, "mean"), r"a cross-attention map shows at most \d+ tokens"),
    ("/evaluate", ("reverse (held out)", None, ["exact_match"], 6, -5), r"examples must be a whole number from 0 to 10"),
])
def test_nonsense_is_refused_with_the_range_and_no_traceback_in_the_log(client, endpoint, args, message):
    before = SERVER["log"].read_text().count("Traceback")
    try:
        out = client.predict(*args, api_name=endpoint)
    except AppError as error:
        said = str(error)
    else:  # the chat says a refusal beside the chats (a toast too), as a note: no error state on them
        assert endpoint == "/chat" and out[3].startswith("**Not sent:**")
        said = out[3]
    assert re.search(message, said), said
    still_works(client)
    if "minimum value" not in said:  # gradio's own widget check logs its traceback; ours log none
        assert SERVER["log"].read_text().count("Traceback") == before, "a handled error wrote a traceback"


def test_start_over_with_a_closed_bridge(client):
    train(client, 5)
    out = client.predict(api_name="/reset_bridge")
    assert "closed gates" in out[0]
    closed = chat(client, "bead=")
    assert text_of(closed[0][-1]) == text_of(closed[1][-1])  # the composition is the anchor again


def test_the_real_pair_when_it_is_not_prepared_names_the_command(client):
    from calm_core.models.real_pair import PREPARE_COMMAND

    with pytest.raises(AppError, match="The real pair is not prepared on this server") as error:
        client.predict(api_name="/real_pair")
    assert PREPARE_COMMAND in str(error.value)
    still_works(client)


# ---- load ------------------------------------------------------------------------------------

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def _answers(client, prompt: str) -> list[str]:
    return [text_of(h[-1]) for h in chat(client, prompt)]


def test_four_sessions_at_once(app_url, tmp_path):  # noqa: F811
    big = write_large_csv(tmp_path / "large.csv", 100_000, letters=5)
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
