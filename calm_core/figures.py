"""Plotly figures of a composition: what a person would rather look at than read.
Pure functions of data (no Gradio), so they are tested without a browser."""
from __future__ import annotations

import html

import plotly.graph_objects as go

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


def _layer_labels(layer_pairs) -> list[str]:
    return [f"{i}: A{k} L{a} → anchor L{b}" for i, (k, b, a) in enumerate(layer_pairs)]


def gate_bars(gates, layer_pairs) -> go.Figure:
    """Mean |tanh(gate)| per composition layer: how far each gate has opened."""
    values = [float(g.abs().mean()) for g in gates]
    fig = go.Figure(go.Bar(x=_layer_labels(layer_pairs), y=values, marker_color=BRIDGE_COLOR,
                           hovertemplate="%{x}<br>mean |tanh(gate)| = %{y:.4f}<extra></extra>"))
    fig.update_yaxes(title="mean |tanh(gate)|", rangemode="tozero")
    return _layout(fig, "Gate opening per composition layer", height=320)


def gate_heatmap(gates, layer_pairs) -> go.Figure:
    """tanh(gate) per layer and channel (scalar gates fill their row)."""
    width = max(g.numel() for g in gates) if gates else 1
    rows = [(g.expand(width) if g.numel() == 1 else g).tolist() for g in gates]
    fig = go.Figure(go.Heatmap(z=rows, y=_layer_labels(layer_pairs), colorscale="RdBu", zmid=0,
                               hovertemplate="%{y}<br>channel %{x}: %{z:.4f}<extra></extra>"))
    fig.update_xaxes(title="anchor channel")
    return _layout(fig, "tanh(gate) per layer and channel", height=120 + 40 * max(1, len(rows)))


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
    val = [h for h in history if h.get("val_loss") is not None]
    fig.add_trace(go.Scatter(x=[h["step"] for h in val], y=[h["val_loss"] for h in val], mode="lines+markers",
                             name="validation loss", line=dict(color=AUGMENT_COLOR)))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="loss per target token")
    return _layout(fig, "Loss", height=320)


def attention_map(record, layer: int, head: int | None = None, row: int = 0) -> go.Figure:
    """Anchor tokens (rows) x augmenting tokens (columns) for one composition layer; one head,
    or the mean over heads when head is None."""
    weights = record.maps[layer]
    if weights is None:
        return _layout(go.Figure(), f"Composition layer {layer} is switched off: nothing to show")
    k = record.layer_pairs[layer][0]
    augment_tokens = record.augment_tokens_by_model[k] if record.augment_tokens_by_model else record.augment_tokens
    matrix = weights[row].mean(0) if head is None else weights[row, head]
    n_anchor, n_augment = len(record.anchor_tokens), len(augment_tokens)
    matrix = matrix[:n_anchor, :n_augment]
    fig = go.Figure(go.Heatmap(
        z=matrix.tolist(), x=[_token_label(j, t) for j, t in enumerate(augment_tokens)],
        y=[_token_label(i, t) for i, t in enumerate(record.anchor_tokens)], colorscale="Viridis", zmin=0,
        hovertemplate="anchor %{y}<br>augment %{x}<br>weight %{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title="anchor token (query)")
    fig.update_xaxes(title="augmenting token (key)", tickangle=-45)
    what = "mean over heads" if head is None else f"head {head}"
    return _layout(fig, f"Cross-attention, composition layer {layer}, {what}",
                   height=max(320, 60 + 18 * n_anchor))


def _token_label(index: int, token: str) -> str:
    """Plotly reads labels as HTML: '<s>' would become strike-through, so escape it."""
    return html.escape(f"{index}:{token!r}", quote=False)


def eval_bars(rows: list[dict], metric: str) -> go.Figure:
    """One bar per model for a metric of an evaluation table."""
    present = [r for r in rows if r.get(metric) is not None]
    colors = [BRIDGE_COLOR if r["model"] == "CALM" else ANCHOR_COLOR if r["model"].startswith("anchor") else AUGMENT_COLOR
              for r in present]
    fig = go.Figure(go.Bar(x=[r["model"] for r in present], y=[r[metric] for r in present], marker_color=colors,
                           text=[f"{r[metric]:.1f}" for r in present], textposition="outside"))
    fig.update_yaxes(title=metric, rangemode="tozero")
    return _layout(fig, f"{metric} by model", height=340)
