"""The app's endpoints through gradio_client, against app.py served over a tiny preset.

Every Client is its own browser session. API clients do not trigger the page's load event, so
each one first calls /use_preset("tiny"). Steps and token counts are kept small: the whole
module runs in well under two minutes on two busy CPU cores."""
from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from benchmarks.app_process import text_of  # noqa: F401  (re-exported to the other app tests)

PRESET = "tiny"
# chat defaults after (message, h_calm, h_anchor, h_augment): max_new_tokens, do_sample, temperature,
# top_k, top_p, seed, gate_scale, layers_off, mode
GREEDY = (6, False, 1.0, 0, 1.0, 0, 1.0, [], "completion")


def lab(url: str, preset: str | None = PRESET) -> Client:
    client = Client(url, verbose=False)
    if preset:
        client.predict(preset, api_name="/use_preset")
    return client


@pytest.fixture
def client(app_url):  # noqa: F811
    return lab(app_url)


def chat(client: Client, message: str, histories=([], [], []), *options):
    """The three histories (the fourth output is the note under the chats)."""
    return client.predict(message, *histories, *(options or GREEDY), api_name="/chat")[:3]


def train(client: Client, steps: int, lr: float = 1e-2, batch_size: int = 4, gate_lr_scale: float | None = None,
          augment_noise: float | None = None) -> tuple:
    """(status, loss plot, gate plot); the fourth output clears the download link."""
    if gate_lr_scale is None and augment_noise is None:  # the widgets' defaults
        return client.predict(steps, lr, batch_size, api_name="/train")[:3]
    return client.predict(steps, lr, batch_size, 1.0 if gate_lr_scale is None else gate_lr_scale,
                          0.0 if augment_noise is None else augment_noise, api_name="/train")[:3]


def plotly_data(plot) -> list:
    assert isinstance(plot, dict) and plot["type"] == "plotly", plot
    figure = json.loads(plot["plot"])
    assert figure["data"], "an empty figure"
    return figure["data"]


def table(update) -> tuple[list, list]:
    """(headers, rows) of a Dataframe output, whether it came back as a value or as an update."""
    value = update.get("value", update) if isinstance(update, dict) else update
    return value["headers"], value["data"]


def still_works(client: Client) -> None:
    """A successful call after an error: the session and the server are fine."""
    histories = chat(client, "abcd=")
    assert all(h[-1]["role"] == "assistant" for h in histories)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- the main path -------------------------------------------------------------------------

def test_start_loads_the_preset_like_the_page_does(app_url):  # noqa: F811
    client = lab(app_url, preset=None)
    out = client.predict(PRESET, api_name="/start")
    headers, rows = table(out[0])
    assert headers[:2] == ["role", "name"]
    assert [r[0] for r in rows] == ["anchor", "augment 0", "bridge"]
    assert "trainable parameters" in out[1]
    assert out[11]["value"] == "reverse (held out)"  # the preset's evaluation set is picked
    assert out[12].startswith("### The tiny table beside the paper's") and "84.3" in out[12]
    assert out[14]["value"] == ["exact_match", "chrf"]  # and the metrics that suit it
    assert "40 training and 10 validation" in out[7]


def test_main_path(app_url, tmp_path):  # noqa: F811
    client = Client(app_url, verbose=False)
    out = client.predict(PRESET, api_name="/use_preset")
    assert [r[0] for r in table(out[0])[1]] == ["anchor", "augment 0", "bridge"]
    assert out[3]["choices"] and out[4]["choices"]  # composition layers to switch off / to look at
    assert [s[0] for s in out[5]["samples"]] == ["abcd=", "fed="]
    assert table(out[6])[0] == ["prompt", "completion"]

    # chat: three histories, each ending with the assistant's answer; a second turn extends them
    first = chat(client, "abcd=")
    assert len(first) == 3
    for history in first:
        assert [m["role"] for m in history] == ["user", "assistant"]
        assert text_of(history[0]) == "abcd=" and text_of(history[-1])
    second = chat(client, "fed=", first, 4, False, 1.0, 0, 1.0, 0, 1.0, [], "chat")
    for history in second:
        assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"] and text_of(history[-1])
    # a closed gate (scale 0) is the anchor alone, exactly
    closed = chat(client, "bead=", ([], [], []), 6, False, 1.0, 0, 1.0, 0, 0.0, [], "completion")
    assert text_of(closed[0][-1]) == text_of(closed[1][-1])

    gates_before = client.predict(api_name="/gates")

    status, loss_plot, gate_plot = train(client, 8)
    assert status.startswith("Step 8/8") and "loss" in status and "Finished 8 steps." in status
    names = [trace["name"] for trace in plotly_data(loss_plot)]
    assert "training loss" in names and "validation loss" in names
    assert len(plotly_data(loss_plot)[0]["x"]) == 8
    plotly_data(gate_plot)

    gates = client.predict(api_name="/gates")
    assert len(gates) == 3
    for plot in gates:
        plotly_data(plot)
    assert gates[0] != gates_before[0], "training did not move the gates"

    attention = client.predict("abcd=dcba", 0, "mean", api_name="/attention")
    plotly_data(attention)
    plotly_data(client.predict("abcd=dcba", 1, 2, api_name="/attention"))
    plotly_data(client.predict("abcd=dcba", 0, "mean", "chat question", api_name="/attention"))

    results, bars, signatures = client.predict("reverse (held out)", None, ["exact_match", "chrf", "loss"], 6, 3,
                                               api_name="/evaluate")
    headers, rows = table(results)
    assert headers[0] == "model" and {"exact_match", "chrf", "loss"} <= set(headers)
    assert [r[0].split(":")[0] for r in rows] == ["anchor", "augment 0", "CALM"]
    assert all(isinstance(r[headers.index("loss")], float) for r in rows)
    plotly_data(bars)
    assert "chrf" in signatures

    # the trained bridge goes out as a zip and comes back in, gates and all
    archive = Path(client.predict(api_name="/download_bridge"))
    assert archive.is_file() and archive.suffix == ".zip"
    with zipfile.ZipFile(archive) as z:
        assert sorted(z.namelist()) == ["bridge.safetensors", "bridge_config.json"]
    client.predict(PRESET, api_name="/use_preset")  # back to the untrained preset bridge
    assert client.predict(api_name="/gates")[0] == gates_before[0]
    out = client.predict([handle_file(str(archive))], api_name="/upload_bridge")
    fresh = out[-8:]  # the bridge message, the attention reading, the baseline menu and column, the folded settings
    assert fresh[0] == "Bridge loaded." and fresh[1]["value"] == "text"  # the attention map's reading (a text preset)
    assert fresh[2]["value"] == "none" and fresh[3]["visible"] is False  # no baseline column: the baselines went
    assert fresh[4]["value"] == "plain" and fresh[5]["value"] == 3.0  # the recipe and the preset's position scale
    assert [r[0] for r in table(out[0])[1]] == ["anchor", "augment 0", "bridge"]
    assert client.predict(api_name="/gates")[:2] == gates[:2]
    still_works(client)


def test_upload_inspect_and_use_data(client, tmp_path):
    words = ["abc", "bca", "cab", "dab", "bad", "fed", "def", "efd", "ace", "cea"]
    path = write_jsonl(tmp_path / "mine.jsonl", [{"prompt": w + "=", "completion": w[::-1]} for w in words])
    preview, note, prompt_col, completion_col, text_col = client.predict(handle_file(str(path)), api_name="/inspect_upload")
    headers, rows = table(preview)
    assert headers == ["prompt", "completion"] and rows[0] == ["abc=", "cba"] and len(rows) == 8
    assert "Use this data" in note
    assert (prompt_col["value"], completion_col["value"], text_col["value"]) == ("prompt", "completion", "(none)")
    note = client.predict(handle_file(str(path)), None, "prompt", "completion", "(none)", 0.2, api_name="/use_data")
    assert "mine.jsonl" in note and "8 training, 2 validation" in note and "keep_anchor" not in note
    assert train(client, 3)[0].startswith("Step 3/3")
    # rehearsal rows (keep_anchor true) are counted on the page and trained toward the anchor alone
    kept = write_jsonl(tmp_path / "kept.jsonl", [{"prompt": w + "=", "completion": w[::-1], "keep_anchor": i % 2 == 0}
                                                 for i, w in enumerate(words)])
    note = client.predict(handle_file(str(kept)), None, "prompt", "completion", "(none)", 0.0, api_name="/use_data")
    assert "10 training, 0 validation" in note and "5 training rows have **keep_anchor** true" in note
    assert train(client, 2)[0].startswith("Step 2/2")
    note = client.predict(None, "train.jsonl", "(none)", "(none)", "(none)", 0.1, api_name="/use_data")
    assert "train.jsonl" in note and "36 training, 4 validation" in note


def test_columns_with_other_names_can_be_mapped(client, tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"source": w, "target": w[::-1]} for w in ("abc", "def", "fab", "cad")])
    _, _, prompt_col, completion_col, _ = client.predict(handle_file(str(path)), api_name="/inspect_upload")
    assert (prompt_col["value"], completion_col["value"]) == ("source", "target")
    note = client.predict(handle_file(str(path)), None, "source", "target", "(none)", 0.25, api_name="/use_data")
    assert "3 training, 1 validation" in note


def wait_for_a_step(job, seconds: float = 60) -> None:
    """Until a submitted /train job reports its first finished step."""
    deadline = time.monotonic() + seconds
    while not any(o[0].startswith("Step") and not o[0].startswith("Step 0/") for o in job.outputs()):
        assert time.monotonic() < deadline and not job.done(), job.outputs()[-1:] or job.status()
        time.sleep(0.2)


def test_stop_ends_a_run_early(client):
    job = client.submit(5000, 1e-3, 4, api_name="/train")
    wait_for_a_step(job)
    assert client.predict(api_name="/stop").startswith("Stopping")
    status = job.result(timeout=60)[0]
    assert "Stopped at step" in status and "/5000" in status and not status.startswith("Step 5000/")
    still_works(client)


# ---- bad inputs: a readable message, and the app keeps working -----------------------------

def test_nothing_loaded_yet(app_url):  # noqa: F811
    client = lab(app_url, preset=None)
    with pytest.raises(AppError, match="No models in this session yet"):
        client.predict(api_name="/gates")
    client.predict(PRESET, api_name="/use_preset")
    still_works(client)


@pytest.mark.parametrize("message, reason", [
    ("   ", "Type a prompt first"),
    ("abcd" * 5000, "Shorten it"),  # far past the tiny models' context
])
def test_a_refused_prompt_is_said_beside_the_chats_which_stay_as_they_were(client, message, reason):
    before = chat(client, "abcd=")
    out = client.predict(message, *before, *GREEDY, api_name="/chat")
    assert [len(h) for h in out[:3]] == [len(h) for h in before] == [2, 2, 2]  # no turn added, none lost
    assert out[3].startswith("**Not sent:**") and reason in out[3]
    still_works(client)


@pytest.mark.parametrize("endpoint", ["/inspect_upload", "/use_data"])
@pytest.mark.parametrize("name, content, expected", [
    ("empty.jsonl", "", r"empty\.jsonl: the file is empty"),
    ("columns.jsonl", '{"source": "ab", "target": "ba"}\n' * 4, r"columns \['source', 'target'\] but needs"),
    ("broken.jsonl", '{"prompt": "ab=", "completion": "ba"}\n{"prompt": "cd=", \n', r"broken\.jsonl: line 2 is not valid JSON"),
])
def test_bad_data_files(client, tmp_path, endpoint, name, content, expected):
    path = tmp_path / name
    path.write_text(content)
    args = (handle_file(str(path)),) if endpoint == "/inspect_upload" else \
        (handle_file(str(path)), None, "(none)", "(none)", "(none)", 0.1)
    if name == "columns.jsonl" and endpoint == "/inspect_upload":  # shown, so its columns can be mapped
        assert "source" in client.predict(*args, api_name=endpoint)[2]["choices"][1]
    else:
        with pytest.raises(AppError, match=expected) as error:
            client.predict(*args, api_name=endpoint)
        assert "Traceback" not in str(error.value)
    note = client.predict(None, "train.jsonl", "(none)", "(none)", "(none)", 0.1, api_name="/use_data")
    assert "train.jsonl" in note
    assert train(client, 2)[0].startswith("Step 2/2")  # the earlier data is still in place


def test_no_data_chosen(client):
    with pytest.raises(AppError, match="Upload a file or pick one of the preset's data sets"):
        client.predict(None, None, "(none)", "(none)", "(none)", 0.1, api_name="/use_data")
    still_works(client)


def test_unknown_model(client, tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(AppError, match="Could not load model") as error:
        client.predict(str(missing), str(missing), 1, "", "", 0, "channel", "after", api_name="/build")
    assert str(missing) in str(error.value)
    with pytest.raises(AppError, match="comma-separated integers"):
        client.predict(str(missing), str(missing), 1, "one,two", "", 0, "channel", "after", api_name="/build")
    with pytest.raises(AppError, match="Choose an anchor model"):
        client.predict("", "", 1, "", "", 0, "channel", "after", api_name="/build")
    still_works(client)  # the preset's composition is still in place
    assert len(client.predict(api_name="/gates")) == 3


def test_compose_with_the_bridge_options(client, tmp_path):
    from calm_core.models.tiny import char_tokenizer, tiny_model

    tok = char_tokenizer()
    for name, arch, seed in (("anchor", "gpt2", 1), ("augment", "llama", 2)):
        tiny_model(arch, len(tok), layers=2, width=32, seed=seed).save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    outputs = client.predict(str(tmp_path / "anchor"), str(tmp_path / "augment"), 1, "", "", 0, "channel", "before", 2,
                             True, 1, api_name="/build")
    summary = next(x for x in outputs if isinstance(x, str) and "Bridge:" in x)
    assert ("added before each anchor layer, 2 recency biases per head, a null slot, a window of 1 augmenting states."
            in summary)


def test_upload_over_the_size_limit(client, tmp_path):
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(300 * 1024**2)  # sparse: takes no disk space
    # gradio_client reads the limit from the app's config and refuses before sending ...
    with pytest.raises(Exception, match="maximum file size") as error:
        client.predict(handle_file(str(big)), api_name="/inspect_upload")
    assert str(200 * 1024**2) in str(error.value)
    # ... and the server refuses it too when a client sends it anyway
    with open(big, "rb") as f:
        response = httpx.post(client.upload_url, files={"files": ("big.jsonl", f)}, timeout=120)
    assert response.status_code == 413 and "maximum allowed size" in response.text
    still_works(client)
    note = client.predict(None, "train.jsonl", "(none)", "(none)", "(none)", 0.1, api_name="/use_data")
    assert "train.jsonl" in note


@pytest.fixture(scope="module")
def other_bridge(tmp_path_factory) -> Path:
    """A bridge saved for a different (wider, deeper) pair of models, as a zip."""
    from calm_core import CALMConfig, ComposedLM
    from calm_core.models.tiny import char_tokenizer, tiny_model

    folder = tmp_path_factory.mktemp("other-bridge")
    tok = char_tokenizer()
    anchor = tiny_model("gpt2", len(tok), layers=3, width=48, seed=5)
    augment = tiny_model("llama", len(tok), layers=2, width=24, seed=6)
    ComposedLM((anchor, tok), [(augment, tok)], CALMConfig(every=1)).save_pretrained(folder / "bridge")
    archive = folder / "other-bridge.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in (folder / "bridge").iterdir():
            z.write(path, path.name)
    return archive


def test_bridge_for_other_models(client, other_bridge, tmp_path):
    gates = client.predict(api_name="/gates")
    with pytest.raises(AppError, match="This bridge does not fit these models") as error:
        client.predict([handle_file(str(other_bridge))], api_name="/upload_bridge")
    assert "width 32" in str(error.value) and "48" in str(error.value)
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(AppError, match="junk.zip is not a valid zip file"):
        client.predict([handle_file(str(junk))], api_name="/upload_bridge")
    stray = tmp_path / "notes.txt"
    stray.write_text("hello")
    with pytest.raises(AppError, match=r"Invalid file type.*'\.zip', '\.json', '\.safetensors'"):
        client.predict([handle_file(str(stray))], api_name="/upload_bridge")
    lone = tmp_path / "bridge_config.json"
    lone.write_text("{}")
    with pytest.raises(AppError, match="is not a CALM bridge config"):
        client.predict([handle_file(str(lone))], api_name="/upload_bridge")
    assert client.predict(api_name="/gates") == gates  # the session's own bridge is untouched
    still_works(client)


# ---- sessions ------------------------------------------------------------------------------

def test_two_sessions_train_at_once(app_url):  # noqa: F811
    a, b, idle = lab(app_url), lab(app_url), lab(app_url)
    idle_gates = idle.predict(api_name="/gates")
    runs = [a.submit(30, 1e-2, 4, api_name="/train"), b.submit(30, 3e-2, 4, api_name="/train")]
    statuses = [run.result(timeout=120)[0] for run in runs]
    for status in statuses:
        assert status.startswith("Step 30/30") and "Finished 30 steps." in status, status
    gates_a, gates_b = a.predict(api_name="/gates"), b.predict(api_name="/gates")
    assert idle.predict(api_name="/gates") == idle_gates, "another session's training changed this one's bridge"
    assert gates_a[0] != idle_gates[0] and gates_b[0] != idle_gates[0] and gates_a[0] != gates_b[0]
    # the same run alone, in a fresh session, ends with exactly A's bridge: B's run did not leak into it
    alone = lab(app_url)
    assert train(alone, 30)[0].startswith("Step 30/30")
    assert alone.predict(api_name="/gates")[:2] == gates_a[:2]
    still_works(idle)


def test_gate_learning_rate_widget_opens_the_gates_faster(app_url):  # noqa: F811
    def widest_gate(scale):
        client = lab(app_url)  # a fresh session on the untrained preset bridge
        _, _, gate_plot = train(client, 4, 1e-3, 4, gate_lr_scale=scale)
        return max(abs(y) for trace in plotly_data(gate_plot) for y in trace.get("y", []) if isinstance(y, (int, float)))

    assert widest_gate(30.0) > 5 * widest_gate(1.0)


def test_augment_noise_widget_reaches_the_trainer(app_url):  # noqa: F811
    def gates_after(noise):
        client = lab(app_url)  # a fresh session on the untrained preset bridge
        assert train(client, 4, 1e-2, 4, augment_noise=noise)[0].startswith("Step 4/4")
        return client.predict(api_name="/gates")[:2]

    assert gates_after(1.0) != gates_after(0.0) == gates_after(0.0)
    with pytest.raises(AppError, match="noise on augmenting states must be a number from 0 up to 10"):
        train(lab(app_url), 4, 1e-2, 4, augment_noise=-1.0)


def test_a_recipe_fills_the_folded_settings_and_starts_a_new_bridge(client):
    client.predict(PRESET, api_name="/use_preset")
    out = client.predict("knowledge", api_name="/choose_recipe")
    note, recipe, position, value = out[5], out[6], out[7], out[8]
    assert recipe["value"] == "knowledge" and position["value"] == 25.0 and value["value"] == 0.0
    assert "Recipe **knowledge**" in note and "kept fixed" not in note and "value path at 0×" in note
    assert "Start over" in note  # the shipped bridge goes on as it is
    client.predict(api_name="/reset_bridge")
    status = client.predict(3, 1e-2, 4, 1.0, 0.0, "calm", "knowledge", 25.0, 0.0, False, api_name="/train")[0]
    assert "Recipe knowledge" in status and "cache on" in status and "memory ledger" in status, status
    with pytest.raises(Exception, match="value path: learning rate|value lr scale must be"):
        client.predict(3, 1e-2, 4, 1.0, 0.0, "calm", "knowledge", 25.0, -1.0, False, api_name="/train")
