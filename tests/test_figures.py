"""Figures render from plain data, without a browser."""
import plotly.graph_objects as go
import pytest
import torch

from calm_core import figures

from .conftest import randomize_bridge

HISTORY = [{"step": s, "loss": 3.0 / s, "val_loss": 3.2 / s if s % 2 == 0 else None, "gates": [0.01 * s, 0.02 * s]}
           for s in range(1, 6)]


def test_layer_diagram_draws_one_line_per_composition_layer(composed):
    fig = figures.layer_diagram(4, [4], composed.layer_pairs())
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 2 and list(lines[0].y) == [1, 1] and list(lines[1].y) == [3, 3]


def test_layer_diagram_draws_a_bridge_before_a_layer_at_that_layers_input():
    fig = figures.layer_diagram(4, [4], [(0, 0, 3), (0, 2, 3)], insert="before")
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [list(t.y) for t in lines] == [[3, -0.5], [3, 1.5]]
    assert "token embeddings" in lines[0].hovertemplate and "input of anchor layer 2" in lines[1].hovertemplate


def test_gate_figures(composed):
    randomize_bridge(composed)
    gates, pairs = composed.gates(), composed.layer_pairs()
    bars = figures.gate_bars(gates, pairs)
    assert list(bars.data[0].y) == pytest.approx([float(g.abs().mean()) for g in gates])
    heat = figures.gate_heatmap(gates, pairs)
    assert len(heat.data[0].z) == 2 and len(heat.data[0].z[0]) == 32
    history = figures.gate_history(HISTORY, pairs)
    assert len(history.data) == 2 and list(history.data[1].y) == [h["gates"][1] for h in HISTORY]


def test_loss_curves_skip_missing_validation_points():
    fig = figures.loss_curves(HISTORY)
    assert list(fig.data[0].x) == [1, 2, 3, 4, 5] and list(fig.data[1].x) == [2, 4]


def test_attention_map_labels_both_axes(composed):
    randomize_bridge(composed)
    with torch.no_grad(), composed.record_attention() as record:
        composed.logits(["hello world"])
    fig = figures.attention_map(record, 1, head=2)
    z = torch.tensor(fig.data[0].z)
    assert z.shape == (len(record.anchor_tokens), len(record.augment_tokens))
    assert fig.data[0].y[0] == "0:'&lt;s&gt;'" and fig.data[0].y[1] == "1:'h'"
    assert len(fig.data[0].x) == len(record.augment_tokens)
    torch.testing.assert_close(z, record.maps[1][0, 2])
    mean = torch.tensor(figures.attention_map(record, 0).data[0].z)
    torch.testing.assert_close(mean, record.maps[0][0].mean(0))


def test_eval_bars():
    rows = [{"model": "anchor: a", "exact_match": 0.0}, {"model": "augment 0: b", "exact_match": 2.0},
            {"model": "CALM", "exact_match": 80.0}]
    fig = figures.eval_bars(rows, "exact_match")
    assert isinstance(fig, go.Figure) and list(fig.data[0].y) == [0.0, 2.0, 80.0]


def test_eval_bars_one_panel_per_metric_with_counts_as_percentages():
    rows = [{"model": "anchor: a", "exact_match": 0.0, "forgetting: perplexity ratio": 1.0,
             "forgetting: expected words": "8/16"},
            {"model": "augment 0: b", "exact_match": 2.0},
            {"model": "CALM", "exact_match": 80.0, "forgetting: perplexity ratio": 1.02,
             "forgetting: expected words": "9/16"},
            {"model": "anchor + LoRA (10 trained; bridge 12)", "exact_match": 40.0,
             "forgetting: perplexity ratio": 1.4, "forgetting: expected words": "4/16"}]
    fig = figures.eval_bars(rows, ["exact_match", "forgetting: perplexity ratio", "forgetting: expected words"])
    assert len(fig.data) == 3
    assert list(fig.data[0].y) == [0.0, 2.0, 80.0, 40.0]
    assert list(fig.data[1].x) == ["anchor: a", "CALM", "anchor + LoRA"]  # no augmenting model's bar
    assert list(fig.data[2].y) == [50.0, 56.25, 25.0]
    colors = list(fig.data[0].marker.color)
    assert colors[2] == figures.BRIDGE_COLOR and colors[3] == figures.BASELINE_COLOR and colors[0] != colors[3]
    assert fig.layout.annotations[2].text == "forgetting: expected words %"


def test_an_empty_plots_message_is_broken_into_lines_that_fit_a_narrow_plot():
    message = "The held-out exact match appears here when training starts (validation examples with short answers needed)."
    text = figures.empty(message).layout.annotations[0].text
    lines = text.split("<br>")
    assert len(lines) > 1 and max(map(len, lines)) <= 40 and " ".join(lines) == message
