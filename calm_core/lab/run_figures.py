"""Plotly figures of training runs: the held-out exact-match curve of the run in progress, and several kept runs
overlaid (loss, held-out exact match, mean gate opening), one colour per run. Pure functions of the records."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .figures import AUGMENT_COLOR, _layout, empty

PALETTE = ["#3b6fb6", "#d9822b", "#2a9d8f", "#b5446e", "#6a4c93", "#8a8a2e", "#1f7a8c", "#c0392b"]


def accuracy_curve(curve: list[dict], examples: int | None = None) -> go.Figure:
    """Held-out exact match (%) against the step: the answers becoming right, from the closed bridge on."""
    if not curve:
        return empty("The held-out exact match appears here when training starts (validation examples with short "
                     "answers needed).")
    fig = go.Figure(go.Scatter(x=[p["step"] for p in curve], y=[p["exact_match"] for p in curve], mode="lines+markers",
                               name="held-out exact match", line=dict(color=AUGMENT_COLOR)))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="exact match %", range=[-2, 102])
    sample = f"{examples} validation answers" if examples else "Validation answers"
    return _layout(fig, f"{sample}, checked while training", height=320)


def run_comparison(records) -> go.Figure:
    """Each chosen run's training loss, held-out exact match and mean gate opening over its steps."""
    if not records:
        return empty("Tick two or more runs above to overlay their curves.")
    fig = make_subplots(rows=1, cols=3, subplot_titles=("training loss", "held-out exact match %",
                                                        "mean gate opening |tanh(g)|"))
    for i, record in enumerate(records):
        color, name = PALETTE[i % len(PALETTE)], f"{record.id} · {record.name}"
        history = [h for h in record.history if h.get("loss") is not None]
        steps = [h["step"] for h in history]
        fig.add_trace(go.Scatter(x=steps, y=[h["loss"] for h in history], mode="lines", name=name, legendgroup=name,
                                 line=dict(color=color)), row=1, col=1)
        fig.add_trace(go.Scatter(x=[p["step"] for p in record.accuracy], y=[p["exact_match"] for p in record.accuracy],
                                 mode="lines+markers", name=name, legendgroup=name, showlegend=False,
                                 line=dict(color=color)), row=1, col=2)
        gates = [sum(h["gates"]) / len(h["gates"]) for h in history if h.get("gates")]
        fig.add_trace(go.Scatter(x=[h["step"] for h in history if h.get("gates")], y=gates, mode="lines", name=name,
                                 legendgroup=name, showlegend=False, line=dict(color=color)), row=1, col=3)
    fig.update_xaxes(title="step")
    fig.update_yaxes(range=[-2, 102], row=1, col=2)
    return _layout(fig, "Runs compared", height=380, legend=dict(orientation="h", y=-0.25))
