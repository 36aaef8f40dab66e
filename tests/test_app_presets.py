"""The shipped presets: the Evaluate tab measures every set the way the preset's table was measured
(tokens, scoring, table row), and the Chat tab uses the preset's own settings.

By default each set is evaluated on its first EXAMPLES examples and must come within TOLERANCE
points of the table (greedy decoding is deterministic; a wrong scoring is 50-100 points off).
CALM_FULL_PRESET_CHECK=1 evaluates every example and requires the table's numbers to 0.05."""
from __future__ import annotations

import os

import pytest

from calm_core.lab.presets import list_presets
from calm_core.lab.session import LabSession

FULL = os.environ.get("CALM_FULL_PRESET_CHECK") == "1"
EXAMPLES = 0 if FULL else 8
TOLERANCE = 0.05 if FULL else 20.0
COLUMNS = {"anchor": "m_B", "augment 0": "m_A", "CALM": "CALM"}  # the app's rows, the paper's names

pytestmark = pytest.mark.skipif(not {"kv_arithmetic", "translation"} <= set(list_presets()),
                                reason="the shipped presets are not here")


@pytest.fixture(scope="module")
def sessions():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = LabSession()
            cache[name].use_preset(name)
        return cache[name]
    return get


@pytest.mark.parametrize("preset_name, label", [
    ("kv_arithmetic", "KV-SUBS"), ("kv_arithmetic", "NUM-MATH"), ("kv_arithmetic", "KV-MATH (held-out keys)"),
    ("kv_arithmetic", "KV-MATH (train keys)"), ("translation", "held-out sentences"),
    ("translation", "parallel-set sentences"),
])
def test_evaluate_agrees_with_the_presets_table(sessions, preset_name, label):
    session = sessions(preset_name)
    preset = session.preset
    cells = preset.table_cells(label)
    assert cells, f"{label}: no row of the preset's table says what this set scored"
    metrics = sorted(set(cells) & {"exact_match", "chrf", "bleu"})
    table = session.evaluate(preset.eval_files[label], metrics, preset.eval_max_new_tokens, EXAMPLES,
                             scoring=preset.scoring(label))
    for row in table.rows:
        column = COLUMNS[row["model"].split(":")[0]]
        for metric in metrics:
            expected = cells[metric][column]
            assert abs(row[metric] - expected) <= TOLERANCE, (label, column, metric, row[metric], expected)


def test_chat_and_evaluate_use_the_presets_settings(sessions):
    from calm_app import views

    translation = sessions("translation")
    tokens, mode, *_ = views.chat_settings(translation)
    assert tokens["value"] == 48 and mode["value"] == "completion"
    assert views.eval_choices(translation)[4]["value"] == 48
    answer = list(translation.replies("se deseg moga von mevi vape rire = ", tokens["value"]))[-1][0]
    assert answer.strip() == "a green book helps the old apple"  # whole, not cut at 16 tokens
    story = translation.preset.story_markdown()
    assert "book = *deseg*" in story
    assert "held out" in sessions("kv_arithmetic").preset.story_markdown()


def test_the_translation_bridge_has_no_gate_and_starting_over_gives_one():
    from calm_app import handlers, views

    session = LabSession()
    session.use_preset("translation")
    assert "**no gate**" in views.bridge_summary(session.calm)
    out = handlers.reset_bridge(session)
    assert "had no gate" in out[0]
    assert session.calm.config.gate == "channel" and all(float(g.abs().max()) == 0 for g in session.calm.gates())
    prompt = "se deseg moga von mevi vape rire = "
    assert session.calm.generate(prompt, max_new_tokens=8) == session.solo(0).generate(prompt, max_new_tokens=8)


def test_the_served_queue_does_not_spin_while_idle():
    """app.py serves through calm_app.serving.quiet_queue: gradio's 1 ms idle polling (10% of a core per idle
    server, measured) becomes 20 ms; a longer wait someone chose is kept."""
    import gradio as gr

    from calm_app.serving import IDLE_POLL_S, quiet_queue

    with gr.Blocks() as blocks:
        gr.Markdown("x")
    queue = quiet_queue(blocks.queue())._queue
    assert {name: getattr(queue, name) for name in IDLE_POLL_S} == IDLE_POLL_S
    queue.sleep_when_free = 0.5
    assert quiet_queue(blocks)._queue.sleep_when_free == 0.5
