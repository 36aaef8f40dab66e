"""Plotly figures of a composition: what a person would rather look at than read.
Pure functions of data (no Gradio), so they are tested without a browser."""
from __future__ import annotations

import html
import textwrap

import plotly.graph_objects as go
import torch

ANCHOR_COLOR, AUGMENT_COLOR, BRIDGE_COLOR = "#3b6fb6", "#d9822b", "#2a9d8f"


def _layout(fig: go.Figure, title: str, **kw) -> go.Figure:
    fig.update_layout(title=title, template="plotly_white", margin=dict(l=50, r=20, t=50, b=40), **kw)
    return fig


def layer_diagram(anchor_depth: int, augment_depths: list[int], layer_pairs: list[tuple[int, int, int]],
                  anchor_name: str = "anchor", augment_names: list[str] | None = None,
                  insert: str = "after") -> go.Figure:
    """Both models' layer stacks side by side, a line from each augmenting layer to where the bridge
    writes into the anchor: a layer's output ("after"), or its input ("before"), drawn half a layer
    lower, so that "before layer 0" lands on the token embeddings."""
    augment_names = augment_names or [f"augment {k}" for k in range(len(augment_depths))]
    fig = go.Figure()
    columns = [(0.0, anchor_depth, anchor_name, ANCHOR_COLOR)] + [
        (float(k + 1), depth, name, AUGMENT_COLOR) for k, (depth, name) in enumerate(zip(augment_depths, augment_names))]
    for x, depth, name, color in columns:
        fig.add_trace(go.Scatter(
            x=[x] * depth, y=list(range(depth)), mode="markers+text", name=name,
            marker=dict(symbol="square", size=18, color=color), text=[str(i) for i in range(depth)],
            textposition="middle left" if x == 0 else "middle right",
            hovertemplate=f"{name}<br>layer %{{y}}<extra></extra>"))
    before = insert == "before"
    for index, (k, anchor_layer, augment_layer) in enumerate(layer_pairs):
        where = (("the token embeddings" if anchor_layer == 0 else f"the input of anchor layer {anchor_layer}")
                 if before else f"the output of anchor layer {anchor_layer}")
        fig.add_trace(go.Scatter(
            x=[k + 1, 0], y=[augment_layer, anchor_layer - 0.5 * before], mode="lines", showlegend=False,
            line=dict(color=BRIDGE_COLOR, width=3),
            hovertemplate=f"composition layer {index}: {augment_names[k]} layer {augment_layer} "
                          f"is added to {where}<extra></extra>"))
    fig.update_xaxes(visible=False, range=[-0.6, len(augment_depths) + 0.6])
    fig.update_yaxes(title="layer (input at the bottom)", range=[-1, max([anchor_depth, *augment_depths]) - 0.2])
    return _layout(fig, "Which anchor layer attends to which augmenting layer", height=380)


def layer_label(index: int, pair) -> str:
    """The one way a composition layer is named, in every figure and menu."""
    k, anchor_layer, augment_layer = pair
    return f"{index}: augment {k} L{augment_layer} → anchor L{anchor_layer}"


def _layer_labels(layer_pairs) -> list[str]:
    return [layer_label(i, pair) for i, pair in enumerate(layer_pairs)]


NO_GATE = "no gate: this bridge adds its output in full (1.0 everywhere), so it never started as the anchor"


def gate_bars(gates, layer_pairs, gate_type: str = "channel") -> go.Figure:
    """Mean |tanh(gate)| per composition layer: how far each gate has opened."""
    values = [float(g.abs().mean()) for g in gates]
    fig = go.Figure(go.Bar(x=_layer_labels(layer_pairs), y=values, marker_color=BRIDGE_COLOR,
                           text=[f"{v:.3f}" for v in values], textposition="outside", cliponaxis=False,
                           hovertemplate="%{x}<br>mean |tanh(gate)| = %{y:.4f}<extra></extra>"))
    fig.update_yaxes(title="mean |tanh(gate)|", range=[0, max(values + [1e-3]) * 1.25])
    title = NO_GATE if gate_type == "none" else "Gate opening per composition layer"
    return _layout(fig, title, height=340)


def gate_heatmap(gates, layer_pairs, gate_type: str = "channel") -> go.Figure:
    """tanh(gate) per layer and channel (scalar gates fill their row), on a scale symmetric about 0."""
    width = max(g.numel() for g in gates) if gates else 1
    rows = [(g.expand(width) if g.numel() == 1 else g).tolist() for g in gates]
    top = max([abs(v) for row in rows for v in row] + [1e-3])  # symmetric about 0, never a collapsed colour bar
    fig = go.Figure(go.Heatmap(z=rows, y=_layer_labels(layer_pairs), colorscale="RdBu", zmid=0, zmin=-top, zmax=top,
                               colorbar=dict(title="tanh(gate)", len=1.0, thickness=14),
                               hovertemplate="%{y}<br>channel %{x}: %{z:.4f}<extra></extra>"))
    fig.update_xaxes(title="anchor channel")
    title = NO_GATE if gate_type == "none" else "tanh(gate) per layer and channel"
    return _layout(fig, title, height=max(260, 140 + 40 * len(rows)))


def gate_history(history: list[dict], layer_pairs) -> go.Figure:
    """Gate opening per layer over training steps."""
    fig = go.Figure()
    steps = [h["step"] for h in history]
    for i, label in enumerate(_layer_labels(layer_pairs)):
        fig.add_trace(go.Scatter(x=steps, y=[h["gates"][i] for h in history], mode="lines+markers", name=label))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="mean |tanh(gate)|", rangemode="tozero")
    return _layout(fig, "Gate openings during training", height=320)


def loss_curves(history: list[dict]) -> go.Figure:
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[h["step"] for h in history], y=[h["loss"] for h in history], mode="lines+markers",
                             name="training loss", line=dict(color=ANCHOR_COLOR)))
    # a record repeats the last validation loss until the next evaluation: draw each value once
    val = [h for i, h in enumerate(history) if h.get("val_loss") is not None
           and (i == 0 or h["val_loss"] != history[i - 1].get("val_loss"))]
    fig.add_trace(go.Scatter(x=[h["step"] for h in val], y=[h["val_loss"] for h in val], mode="lines+markers",
                             name="validation loss", line=dict(color=AUGMENT_COLOR)))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="loss per target token")
    return _layout(fig, "Loss", height=320)


def attention_map(record, layer: int, head: int | None = None, row: int = 0, null_slot: bool = False) -> go.Figure:
    """Anchor tokens (rows) x augmenting tokens (columns) for one composition layer; one head,
    or the mean over heads when head is None. With a null slot, its share (what was left to write
    nothing) is the first column."""
    weights = record.maps[layer]
    if weights is None:
        return _layout(go.Figure(), f"Composition layer {layer} is switched off: nothing to show")
    k = record.layer_pairs[layer][0]
    augment_tokens = record.augment_tokens_by_model[k] if record.augment_tokens_by_model else record.augment_tokens
    matrix = weights[row].mean(0) if head is None else weights[row, head]
    n_anchor, n_augment = len(record.anchor_tokens), len(augment_tokens)
    matrix = matrix[:n_anchor, :n_augment]
    columns = [_token_label(j, t) for j, t in enumerate(augment_tokens)]
    if null_slot:
        matrix = torch.cat([(1 - matrix.sum(-1, keepdim=True)).clamp(0, 1), matrix], -1)
        columns = ["∅ null slot"] + columns
    rows = [_token_label(i, t) for i, t in enumerate(record.anchor_tokens)]
    fig = go.Figure(go.Heatmap(
        z=matrix.tolist(), x=columns,
        y=rows, colorscale="Viridis", zmin=0, zmax=1,
        hovertemplate="anchor %{y}<br>augment %{x}<br>weight %{z:.3f}<extra></extra>"))
    # every token labelled (plotly would skip every other one on a long axis)
    fig.update_yaxes(autorange="reversed", title="anchor token (query)", tickmode="array", tickvals=rows)
    fig.update_xaxes(title="augmenting token (key)", tickangle=-45, tickmode="array", tickvals=columns)
    what = "mean over heads" if head is None else f"head {head}"
    return _layout(fig, f"Cross-attention, composition layer {layer}, {what}",
                   height=max(320, 120 + 18 * n_anchor))


def _token_label(index: int, token: str) -> str:
    """Plotly reads labels as HTML: '<s>' would become strike-through, so escape it."""
    return html.escape(f"{index}:{token!r}", quote=False)


def empty(message: str, width: int = 40) -> go.Figure:
    """A figure that says what will be drawn here, instead of an empty frame; the message is broken into lines of at
    most `width` characters (plotly never wraps: one long line was cut off in a plot a third of the page wide)."""
    fig = go.Figure()
    lines = textwrap.wrap(message, width) or [""]
    fig.add_annotation(text="<br>".join(lines), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, "", height=260)


BASELINE_COLOR = "#8e6bbf"


def _model_color(model: str) -> str:
    if model == "CALM":
        return BRIDGE_COLOR
    if model.startswith("anchor +") or model.startswith("anchor, "):  # a baseline: the anchor itself trained
        return BASELINE_COLOR
    return ANCHOR_COLOR if model.startswith("anchor") else AUGMENT_COLOR


def _bar_value(value):
    """A table cell as a bar: numbers as they are, "held/asked" counts as a percentage, anything else as no bar."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and "/" in value:
        held, asked = value.split("/", 1)
        return 100.0 * int(held) / max(1, int(asked)) if held.isdigit() and asked.isdigit() else None
    return None


def eval_bars(rows: list[dict], metrics) -> go.Figure:
    """One panel per metric of an evaluation table (a single name: one panel), one bar per model that has it; the
    models keep their colours across panels (anchor, augmenting model, composition, baselines)."""
    from plotly.subplots import make_subplots

    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    metrics = [m for m in metrics if any(_bar_value(r.get(m)) is not None for r in rows)] or metrics[:1]
    titles = [m + (" %" if any(isinstance(r.get(m), str) for r in rows) else "") for m in metrics]
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=titles if len(metrics) > 1 else None)
    for col, metric in enumerate(metrics, start=1):
        present = [(r["model"], _bar_value(r.get(metric))) for r in rows if _bar_value(r.get(metric)) is not None]
        # a baseline's parameter counts are in the table: the bar's label is its kind
        fig.add_trace(go.Bar(x=[m.split(" (")[0] for m, _ in present], y=[v for _, v in present], showlegend=False,
                             marker_color=[_model_color(m) for m, _ in present], cliponaxis=False,
                             text=[f"{v:.1f}" if v >= 10 else f"{v:.3g}" for _, v in present], textposition="outside"),
                      row=1, col=col)
        fig.update_yaxes(range=[0, max([v for _, v in present] + [1e-3]) * 1.2], row=1, col=col)
    fig.update_xaxes(tickangle=-25)
    return _layout(fig, "" if len(metrics) > 1 else f"{titles[0]} by model", height=380)
